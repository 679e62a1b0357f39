"""Reading and labelling sessions: ``sessions``, ``calls``, ``show``, ``steps``, ``outcome``, ``reward``."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import typer

from orchard_rec.cli.common import (
    FORCE_HELP,
    CliError,
    Credit,
    CreditOpt,
    DbOpt,
    OnMismatch,
    OnMismatchOpt,
    SessionsOpt,
    StatusMetavar,
    _check_output,
    _check_statuses,
    _db_error,
    _load_tokenizer,
    _parse_db,
    _reading,
    _since,
    _table,
    _warn,
    _when,
    console,
    open_read,
    open_write,
    usage_error,
)

if TYPE_CHECKING:
    from orchard_rec.records import CallRecord
    from orchard_rec.storage.store import Store


# -- reading -------------------------------------------------------------------------------------------------


def _session_rows(
    store: Store,
    *,
    limit: int | None,
    since: float | None,
    harness: str | None,
    status: list[str] | None,
    min_reward: float | None,
) -> tuple[list[dict[str, Any]], int]:
    """The newest ``limit`` sessions matching the filters (oldest first), and how many matched."""
    from orchard_rec.storage.queries import newest_sessions
    from orchard_rec.storage.rows import _epoch

    rows, total = newest_sessions(
        store, limit=limit if min_reward is None else None, since=since, harness=harness, status=status
    )
    if min_reward is not None:
        rows = [r for r in rows if _scalar_reward(r["reward"]) is not None]
        rows = [r for r in rows if (_scalar_reward(r["reward"]) or 0.0) >= min_reward]
        total = len(rows)
        rows = rows[:limit] if limit else rows
    sizes = _session_sizes(store, [r["id"] for r in rows])
    out = []
    for r in reversed(rows):
        model, tokens = sizes.get(r["id"], (None, None))
        out.append(
            {
                "id": r["id"],
                "calls": r["call_count"],
                "status": r["status"],
                "reward": r["reward"],
                "model": model,
                "tokens": tokens,
                "harness": r["harness"],
                "metadata": r["outcome_metadata"] or {},
                "created_at": _epoch(r["created_at"]),
                "updated_at": _epoch(r["updated_at"]),
            }
        )
    return out, total


def _scalar_reward(v: Any) -> float | None:
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = json.loads(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _session_sizes(store: Store, ids: list[str]) -> dict[str, tuple[str | None, int | None]]:
    """Each session's model (its last call's) and size: the largest context of its calls
    (``records.context_tokens``: ids when recorded, else usage), as the viewer counts it."""
    from orchard_rec.records import context_tokens

    out: dict[str, tuple[str | None, int | None]] = {}
    for k in range(0, len(ids), 500):
        for summary, calls in store.iter_sessions_calls(ids[k : k + 500]):
            model, size = None, None
            for c in calls:
                model = c.model or model
                n = context_tokens(c)
                size = n if size is None or (n is not None and n > size) else size
            out[summary.id] = (model, size)
    return out


def _reward_text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = json.loads(v)
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items())
    return str(v)


def sessions(
    db: str = DbOpt,
    as_json: bool = typer.Option(False, "--json", help="A JSON list instead of a table."),
    limit: int | None = typer.Option(
        None,
        "--limit",
        "-n",
        help="The newest N sessions (default: 100 in a table, all with --json; 0: all).",
    ),
    since: datetime | None = typer.Option(None, "--since", help="Active since (ISO date/time, UTC)."),
    harness: str | None = typer.Option(None, "--harness", help="Only sessions of this harness."),
    status: list[str] | None = typer.Option(
        None, "--status", metavar=StatusMetavar, help="Outcome status (repeatable)."
    ),
    min_reward: float | None = typer.Option(None, "--min-reward", help="Scalar reward at least this."),
) -> None:
    """List recorded sessions (newest last) with their outcome, model and size."""
    _check_statuses(status)
    n = limit if limit is not None else (None if as_json else 100)
    with _reading(db) as store:
        rows, total = _session_rows(
            store, limit=n or None, since=_since(since), harness=harness, status=status, min_reward=min_reward
        )
    if as_json:
        typer.echo(json.dumps(rows))
        return
    _table(
        [
            "session",
            "calls",
            "status",
            "reward",
            "model",
            "tokens",
            "harness",
            "first call (UTC)",
            "last call (UTC)",
        ],
        [
            [
                s["id"],
                str(s["calls"]),
                s["status"] or "-",
                _reward_text(s["reward"]),
                s["model"] or "-",
                "-" if s["tokens"] is None else str(s["tokens"]),
                s["harness"] or "-",
                _when(s["created_at"] or 0),
                _when(s["updated_at"] or 0),
            ]
            for s in rows
        ],
    )
    if len(rows) < total:
        typer.echo(f"(the newest {len(rows)} of {total} sessions; --limit 0 shows all)", err=True)


def _call_summary(r: CallRecord, *, full: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {
        "seq": r.seq,
        "call_id": r.call_id,
        "dialect": r.dialect.value,
        "method": r.method,
        "path": r.path,
        "stream": r.stream,
        "status": r.status_code,
        "outcome": r.outcome.value,
        "model": r.model,
        "harness": r.harness,
        "prompt_tokens": None if r.prompt_ids is None else len(r.prompt_ids),
        "completion_tokens": None if r.completion_ids is None else len(r.completion_ids),
        "finish_reason": r.finish_reason,
        "latency_ms": round((r.done_at - r.received_at) * 1000, 2),
        "error": r.error,
    }
    if full:
        d.update(
            received_at=r.received_at,
            usage=r.usage,
            metadata=dict(r.metadata),
            request=r.request,
            response=r.response,
        )
    return d


def _print_calls(recs: list[CallRecord]) -> None:
    rows = []
    for r in recs:
        s = _call_summary(r)
        rows.append(
            [
                str(s["seq"]),
                str(s["dialect"]),
                "yes" if s["stream"] else "no",
                str(s["status"]),
                str(s["outcome"]),
                str(s["prompt_tokens"] if s["prompt_tokens"] is not None else "-"),
                str(s["completion_tokens"] if s["completion_tokens"] is not None else "-"),
                str(s["finish_reason"] or "-"),
                str(s["latency_ms"]),
            ]
        )
    _table(
        ["seq", "dialect", "stream", "status", "outcome", "prompt ids", "completion ids", "finish", "ms"],
        rows,
    )


def calls(
    session: str = typer.Argument(..., help="Session id."),
    db: str = DbOpt,
    as_json: bool = typer.Option(
        False, "--json", help="A JSON list with each call's request and response as recorded."
    ),
    seq: int | None = typer.Option(None, "--seq", help="Only the call with this sequence number."),
) -> None:
    """List the calls of one session, in sequence order."""
    with _reading(db) as store:
        recs = store.calls(session)
        if not recs and store.session(session) is None:
            raise CliError(f"no session {session!r} in {db}", "list them with `orchard-rec sessions`")
    if seq is not None:
        recs = [r for r in recs if r.seq == seq]
        if not recs:
            raise CliError(f"session {session!r} has no call {seq}")
    if as_json:
        typer.echo(json.dumps([_call_summary(r, full=True) for r in recs], default=str))
        return
    _print_calls(recs)


def _plain_sample(s: Any, tok: Any, prompt_chars: int) -> str:
    """A sample as text with the loss mask in markers: <train>..</train> (credited),
    <gen>..</gen> (generated, not credited), <obs>..</obs> (observation)."""

    def piece(ids: list[int]) -> str:
        if tok is None:
            return " ".join(map(str, ids)) + " "
        try:
            return str(tok.decode(ids, skip_special_tokens=False))
        except TypeError:
            return str(tok.decode(ids))

    generated = [False] * s.response_length
    for t in s.turns:
        for i in range(t.start, t.end):
            generated[i] = True
    prompt = piece(s.prompt_ids)
    head = (
        f"# session {s.session_id} sample {s.index} status {s.status} reward {s.reward} "
        f"tokens {len(s.tokens)} prompt {s.prompt_length} response {s.response_length} "
        f"trained {sum(s.loss_mask)} turns {len(s.turns)}"
    )
    out = [head, "\n"]
    if len(prompt) > prompt_chars:
        out.append(f"[... {len(prompt) - prompt_chars} characters of prompt]\n")
        prompt = prompt[-prompt_chars:]
    out.append(prompt)
    resp = s.response_ids
    i = 0
    while i < len(resp):
        kind = "train" if s.loss_mask[i] else ("gen" if generated[i] else "obs")
        j = i
        while j < len(resp) and ("train" if s.loss_mask[j] else ("gen" if generated[j] else "obs")) == kind:
            j += 1
        out.append(f"<{kind}>{piece(resp[i:j])}</{kind}>")
        i = j
    out.append("\n")
    return "".join(out)


def show(
    session: str = typer.Argument(..., help="Session id."),
    db: str = DbOpt,
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer to decode ids (path, or 'demo'); ids are shown without it."
    ),
    on_mismatch: OnMismatch = OnMismatchOpt,
    credit: Credit = CreditOpt,
    prompt_chars: int = typer.Option(
        600, "--prompt-chars", help="Show at most this many characters of each prompt (its end)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="The samples as JSON lines (the jsonl export's rows)."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Text with <train>/<gen>/<obs> markers (the default when piped)."
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Write the viewer's session page to this file (one self-contained HTML)."
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Print a session's samples with the trained tokens highlighted."""
    if html is not None:
        _check_output(html, db, force, "--html")
        _show_html(session, db, tokenizer, on_mismatch, credit, html)
        return
    from orchard_rec.pipeline import iter_samples
    from orchard_rec.reconstruct.credit import credit_policy
    from orchard_rec.render import render_sample
    from orchard_rec.selection import Selection

    tok = _load_tokenizer(tokenizer, hf=False) if tokenizer else None
    with _reading(db) as store:
        if store.session(session) is None:
            raise CliError(f"no session {session!r} in {db}", "list them with `orchard-rec sessions`")
        selection = Selection(sessions=[session], on_mismatch=on_mismatch, credit=credit_policy(credit))
        for s in iter_samples(store, selection):
            if as_json:
                typer.echo(json.dumps(s.to_dict()))
            elif plain or not console.is_terminal:
                typer.echo(_plain_sample(s, tok, prompt_chars), nl=False)
            else:
                console.print(render_sample(s, tok, prompt_chars=prompt_chars))


def _show_html(
    session: str, db: str, tokenizer: str | None, on_mismatch: str, credit: str, out: Path
) -> None:
    """``show --html``: the viewer's session page as one self-contained file."""
    from orchard_rec.ui import UIError, render_session_html

    tok = _load_tokenizer(tokenizer, hf=False) if tokenizer else None
    with _reading(db) as store:
        try:
            page = render_session_html(store, session, tokenizer=tok, on_mismatch=on_mismatch, credit=credit)
        except UIError as exc:
            raise CliError(f"{exc} in {db}", "list them with `orchard-rec sessions`") from None
    from orchard_rec.exporters.base import atomic_output, output_set

    with output_set(lambda p: _check_output(p, db, True, "--html")) as outputs:
        with atomic_output(out) as f:
            f.write(page.encode())
        outputs.commit()
    typer.echo(f"wrote {out} ({len(page.encode()) / 1e6:.1f} MB, self-contained)")


# -- outcome --------------------------------------------------------------------------------------------------------


def _parse_metadata(pairs: list[str] | None, blob: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if blob:
        try:
            m = json.loads(blob)
        except json.JSONDecodeError as exc:
            raise usage_error(f"--metadata-json is not JSON: {exc.msg} (at character {exc.pos})") from None
        if not isinstance(m, dict):
            raise usage_error('--metadata-json must be a JSON object, e.g. \'{"task": "t1"}\'')
        meta.update(m)
    for p in pairs or ():
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise usage_error(f"--metadata {p!r}: use KEY=VALUE, e.g. --metadata task=t1")
        try:
            meta[k] = json.loads(v)  # numbers and booleans keep their type
        except json.JSONDecodeError:
            meta[k] = v
    return meta


def outcome(
    session: str = typer.Argument(..., help="Session id."),
    reward: float | None = typer.Option(None, "--reward", help="The scalar reward."),
    reward_json: str | None = typer.Option(
        None,
        "--reward-json",
        help='Named rewards, e.g. \'{"tests": 1, "style": 0.5}\' (with --reward: stored as "reward" beside them).',
    ),
    status: Literal["completed", "truncated", "aborted", "failed"] | None = typer.Option(
        None, "--status", help="How the session ended."
    ),
    step_values: str | None = typer.Option(
        None, "--step-values", help="Comma-separated value per model turn."
    ),
    metadata: list[str] | None = typer.Option(
        None,
        "--metadata",
        help="KEY=VALUE stored with the outcome, e.g. task=t1 for --group-by (repeatable; other keys stay).",
    ),
    metadata_json: str | None = typer.Option(
        None, "--metadata-json", help="Outcome metadata as a JSON object (merged into the stored keys)."
    ),
    clear: list[str] | None = typer.Option(
        None,
        "--clear",
        help="Remove a stored field: reward, status, step_values, metadata, metadata.KEY, or all (repeatable).",
    ),
    create: bool = typer.Option(False, "--create", help="Create the session if no call recorded it yet."),
    db: str = DbOpt,
) -> None:
    """Set a session's reward/status/metadata (flows into every export); what is given merges into what is stored."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage.outcome import OutcomeChange
    from orchard_rec.storage.outcome import as_json as outcome_as_json

    sets: dict[str, Any] = {}
    r = _reward_option(reward, reward_json)
    if r is not None:
        sets["reward"] = r
    if status is not None:
        sets["status"] = status
    if step_values is not None:
        try:
            sets["step_values"] = tuple(float(x) for x in step_values.split(","))
        except ValueError:
            raise usage_error("--step-values takes numbers separated by commas, e.g. 0,0.5,1") from None
    meta = _parse_metadata(metadata, metadata_json)
    if meta:
        sets["metadata"] = meta
    change = _cli_outcome_change(OutcomeChange, sets, clear, "--reward-json" if reward_json else "--reward")
    open_read(db).close()  # exists and is migrated (else says which command migrates); creates nothing
    store = open_write(db, migrate_schema=False)
    try:
        if store.session(session) is None and not create:
            raise CliError(
                f"no session {session!r} in {db}",
                "check the id (`orchard-rec sessions`), or --create to record an outcome before any call",
            )
        merged = store.update_outcome(session, change)
    except sa_exc.SQLAlchemyError as exc:
        raise _db_error(exc, _parse_db(db)) from None
    finally:
        store.close()
    shown = outcome_as_json(merged)
    typer.echo(
        f"session {session}: reward={json.dumps(shown['reward'])} status={shown['status'] or '-'}"
        + (f" metadata={json.dumps(shown['metadata'])}" if shown["metadata"] else "")
    )


def _cli_outcome_change(cls: Any, sets: dict[str, Any], clear: list[str] | None, reward_option: str) -> Any:
    """The options as a ``storage.outcome.OutcomeChange``; its refusals become --option messages."""
    from orchard_rec.storage.outcome import InvalidOutcome

    names = {
        "reward": reward_option,
        "step_values": "--step-values",
        "status": "--status",
        "metadata": "--metadata",
    }
    try:
        return cls(sets, frozenset(clear or ()))
    except InvalidOutcome as exc:
        option = names.get(exc.param or "", "")
        raise usage_error(f"{option}: {exc.message}" if option else exc.message) from None


def _reward_option(reward: float | None, reward_json: str | None) -> Any:
    """``--reward`` and ``--reward-json`` as one stored reward (a number, or named numbers)."""
    if reward_json is None:
        return reward

    def refuse(name: str) -> NoReturn:
        raise usage_error(f"--reward-json: {name} is not a finite number")

    try:
        named = json.loads(reward_json, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise usage_error(
            f"--reward-json is not JSON: {exc.msg} (at character {exc.pos})",
            'e.g. --reward-json \'{"tests": 1, "style": 0.5}\'',
        ) from None
    if isinstance(named, (int, float)) and not isinstance(named, bool):
        named = {"reward": named} if reward is None else {"reward": reward, "value": named}
    if not isinstance(named, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in named.values()
    ):
        raise usage_error("--reward-json must be an object of numbers, e.g. '{\"tests\": 1}'")
    if reward is not None:
        if "reward" in named and named["reward"] != reward:
            raise usage_error('--reward and --reward-json\'s "reward" disagree: give one')
        named = {"reward": reward, **named}
    return named


def set_outcome(store: Store, session: str, outcome: Any) -> None:
    """Record an outcome (``Store.set_outcome`` retries the race with the writer creating the row)."""
    store.set_outcome(session, outcome)


# -- steps and process rewards ---------------------------------------------------------------------------------------


def steps(
    session: str = typer.Argument(..., help="Session id."),
    as_json: bool = typer.Option(False, "--json", help="One JSON list of steps."),
    db: str = DbOpt,
) -> None:
    """What the agent did: each tool call (command, files read/edited) and its result (exit code)."""
    from orchard_rec.recipes import session_steps

    with _reading(db) as store:
        if store.session(session) is None:
            raise CliError(f"no session {session!r} in {db}", "list them with `orchard-rec sessions`")
        found, turns = session_steps(store, session)
    if as_json:
        typer.echo(json.dumps([s.to_dict() for s in found], ensure_ascii=False))
        return
    if not found:
        typer.echo(f"session {session}: no tool calls in {turns} model turns")
        return
    rows = []
    for s in found:
        what = (
            s.command
            if s.command is not None
            else ", ".join(s.edits or s.reads) or json.dumps(s.arguments)[:80]
        )
        code = "-" if s.exit_code is None else str(s.exit_code)
        rows.append(
            [
                str(s.index),
                str(s.turn),
                s.tool,
                s.kind,
                what.replace("\n", " ")[:100],
                code,
                "yes" if s.failed else "",
            ]
        )
    _table(["#", "turn", "tool", "kind", "command / files", "exit", "failed"], rows)


def reward(
    rules: str = typer.Option(
        "swe", "--rules", help="Rule set (built in: swe, Orchard-SWE's process_shaped)."
    ),
    session: list[str] | None = SessionsOpt,
    weights: str | None = typer.Option(
        None, "--weights", help='Override term weights, e.g. \'{"f2p": 0.6, "error_rate": 0}\'.'
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the rewards, store nothing."),
    db: str = DbOpt,
) -> None:
    """Rule-based process rewards from each session's steps and its outcome's gold fields; stored
    with the outcome (metadata.process_reward, step_values) for export --reward-key process."""
    from orchard_rec import rewards as reward_sets
    from orchard_rec.recipes import score_session, with_process_reward

    options: dict[str, Any] = {}
    if weights is not None:
        try:
            options["weights"] = json.loads(weights)
        except json.JSONDecodeError as exc:
            raise usage_error(
                f"--weights is not JSON: {exc.msg}", "e.g. --weights '{\"f2p\": 0.6}'"
            ) from None
    try:
        rule_set = reward_sets.get(rules, **options)
    except KeyError as exc:
        raise usage_error(str(exc.args[0])) from None
    except (ValueError, TypeError) as exc:
        raise usage_error(f"--weights: {exc}") from None
    with _reading(db) as store:
        selected = store.sessions(session)
        if session:
            missing = sorted(set(session) - {s.id for s in selected})
            if missing:
                _warn(f"no session {', '.join(map(repr, missing))} in {db}")
        results = []
        needs = tuple(getattr(rule_set, "gold_fields", ()))
        ungraded = [
            s.id for s in selected if needs and not set(needs) & set(s.outcome.metadata if s.outcome else {})
        ]
        for summary in selected:
            res = None if summary.id in ungraded else score_session(store, summary.id, rule_set)
            if res is not None:
                results.append((summary, res))
    if ungraded:
        hint = (
            f"set the grader's fields first, e.g. orchard-rec outcome {ungraded[0]} --metadata resolved=true"
        )
        if not results:
            raise CliError(
                f"--rules {rules}: no selected session has grader data ({', '.join(needs[:4])}, ...);"
                " nothing scored, nothing stored",
                hint,
            )
        _warn(
            f"--rules {rules}: {len(ungraded)} session(s) have no grader data ({', '.join(needs[:4])}, ...),"
            f" not scored: {', '.join(map(repr, ungraded[:5]))}{' ...' if len(ungraded) > 5 else ''} ({hint})"
        )
    if not results:
        raise CliError("no session to score" + (" matches --session" if session else f" in {db}"))
    rows = []
    for summary, res in results:
        c = res.components
        rows.append(
            [summary.id, f"{res.total:.3f}"]
            + [
                f"{c.get(k, 0.0):.2f}"
                for k in ("resolved", "f2p", "localization", "anchored_flip", "integrity_gate")
            ]
            + ["; ".join(res.notes)[:60]]
        )
    _table(["session", "reward", "resolved", "f2p", "loc", "flip", "gate", "notes"], rows)
    if dry_run:
        return
    store = open_write(db)
    try:
        for summary, res in results:
            set_outcome(store, summary.id, with_process_reward(summary.outcome, rules, res))
    finally:
        store.close()
    typer.echo(f"stored {rules} process rewards for {len(results)} sessions", err=True)
