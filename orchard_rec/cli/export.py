"""Samples out: ``export`` and the reference training loops (``train sft``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer

from orchard_rec.cli.common import (
    FORCE_HELP,
    CliError,
    Credit,
    CreditOpt,
    DbOpt,
    HarnessOpt,
    OnMismatch,
    OnMismatchOpt,
    SessionsOpt,
    SinceOpt,
    StatusMetavar,
    _check_output,
    _check_statuses,
    _load_tokenizer,
    _reading,
    _since,
    _typer,
    _warn,
    console,
    err,
    usage_error,
)

if TYPE_CHECKING:
    from orchard_rec.selection import Selection
    from orchard_rec.storage.store import Store


train_app = _typer(help="Reference training loops (needs the train extra: torch).")


# -- export ------------------------------------------------------------------------------------------------------


FORMAT_INFO: dict[str, tuple[str, str]] = {
    "jsonl": (".jsonl", "one sample per line; the reference every format is tested against"),
    "parquet": (".parquet", "zstd parquet with list<int32> token columns, for pyarrow / pandas / datasets"),
    "slime": (".pt", "torch rollout file(s) with slime's Sample fields, for --load-debug-rollout-data"),
    "slime-sft": (".jsonl", "messages + per-message loss mask and tools, for slime SFT"),
    "verl": (".parquet", "rows of verl's AgentLoopOutput fields, for verl's agent loop"),
    "verl-sft": (".parquet", "messages + tools, for verl's multi-turn SFT dataset"),
    "trl": (".parquet", "input_ids, assistant_masks, completion_mask, for TRL SFTTrainer (pre-tokenized)"),
    "trl-grpo": (
        ".parquet",
        "prompt_ids, completion_ids, logprobs, env_mask, for TRL GRPOTrainer rollout_func",
    ),
    "value": (".parquet", "one row per assistant-turn boundary (prefix ids, turn, reward), for value models"),
    "openrlhf": (
        ".jsonl",
        "observation_tokens, action_ranges, log probs, reward, for OpenRLHF's agent executor",
    ),
}
"""Each built-in format: the file it writes, and what it is for."""

STDOUT_FORMATS = ("jsonl", "slime-sft", "openrlhf")
"""Formats written line by line: ``--out -`` streams them to stdout."""

_KNOWN_SUFFIXES = {".jsonl", ".json", ".parquet", ".pt"}


def _format_doc(target: str) -> str:
    """A plug-in format's first docstring line (its module's when the class has none)."""
    import importlib

    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
        doc = getattr(mod, attr).__doc__ or mod.__doc__ or ""
    except Exception:
        doc = ""
    first = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    return first or f"plug-in ({target})"


def _check_out(fmt: str, out: Path) -> None:
    if str(out) == "-":
        if fmt not in STDOUT_FORMATS:
            raise usage_error(
                f"--out - (stdout) takes a line-based format ({', '.join(STDOUT_FORMATS)}); {fmt} writes a file",
                f"give --out FILE{FORMAT_INFO.get(fmt, ('',))[0]}",
            )
        return
    want = FORMAT_INFO.get(fmt, ("", ""))[0]
    got = "".join(out.suffixes[-1:]).lower()
    if want and got in _KNOWN_SUFFIXES and got != want and not (want == ".jsonl" and got == ".json"):
        raise usage_error(
            f"--format {fmt} writes {want.lstrip('.')}, but --out {out} ends in {got}",
            f"use --out {out.with_suffix(want)}, or the format that writes {got.lstrip('.')}",
        )
    if out.exists() and out.is_dir():
        raise usage_error(f"--out {out} is a folder", "give a file name")


def _dataset_out(out: str, fmt: str, pairs: list[str] | None) -> tuple[str | None, dict[str, Any]]:
    """``--out URL``: the URL and its ``--storage-option``s (None: a file, as before)."""
    from orchard_rec.errors import ExportError
    from orchard_rec.exporters.dataset import is_url, parse_storage_options

    if not is_url(out):
        if pairs:
            raise usage_error("--storage-option is for an --out URL (s3://, gs://, file://)")
        return None, {}
    from orchard_rec.exporters.upload import names_a_file

    if names_a_file(out):  # s3://bucket/samples.jsonl: the format's file(s), uploaded
        _check_out(fmt, Path(out.rsplit("/", 1)[-1]))
    elif fmt not in ("jsonl", "parquet"):  # jsonl: the default, left as it is
        raise usage_error(
            f"--out {out} (a prefix) is a partitioned parquet dataset; --format {fmt} writes files",
            f"name the file: --out {out.rstrip('/')}/samples{FORMAT_INFO.get(fmt, ('',))[0]}, or use --format parquet",
        )
    try:
        return out, parse_storage_options(pairs or ())
    except ExportError as exc:
        raise usage_error(str(exc)) from None


def _url_export(url: str, storage: dict[str, Any], engine: str, address: str | None) -> Callable[..., Any]:
    """``run_export``'s signature, writing the dataset at ``url`` (``exporters.dataset``); ``engine``
    ray: sharded over a Ray cluster (``exporters.ray_engine``, the only place Ray is imported)."""

    def run(
        db: str, fmt: str, _out: Path, *, format_options: Any = None, check: Any = None, **options: Any
    ) -> Any:
        from orchard_rec.exporters.upload import names_a_file, upload_export

        if names_a_file(url):
            if engine == "ray":
                raise usage_error(
                    "--engine ray writes a partitioned dataset: give --out a prefix (ending in /)"
                )
            from orchard_rec.exporters.pipeline import export as run_export

            return upload_export(
                url,
                storage,
                lambda local: run_export(db, fmt, local, format_options=format_options, **options),
            )
        if engine == "ray":
            from orchard_rec.exporters.ray_engine import export_dataset_ray

            return export_dataset_ray(db, url, storage_options=storage, address=address, **options)
        from orchard_rec.exporters.pipeline import export_dataset

        return export_dataset(db, url, storage_options=storage, **options)

    return run


def _group_warning(store: Store, selection: Selection, group_by: str) -> None:
    if group_by == "session":
        return
    selected = store.sessions(selection.sessions, since=selection.since, harness=selection.harness)
    missing = [s for s in selected if s.outcome is None or s.outcome.metadata.get(group_by) is None]
    if selected and len(missing) == len(selected):
        _warn(
            f"--group-by {group_by}: no selected session has {group_by!r} in its outcome metadata, so all "
            f"are one group (set it: orchard-rec outcome SID --metadata {group_by}=VALUE)"
        )
    elif missing:
        _warn(
            f"--group-by {group_by}: {len(missing)} of {len(selected)} sessions have no {group_by!r}: they form one group"
        )


def _reward_key_check(selected: list[Any], key: str) -> None:
    """A --reward-key no selected session has is a mistake (every reward would be null); one
    that only some have is a warning."""
    from orchard_rec.pipeline import pick_reward

    missing = [s.id for s in selected if pick_reward(s.outcome, key) is None]
    if len(missing) < len(selected):
        if missing:
            _warn(
                f"--reward-key {key}: {len(missing)} of {len(selected)} sessions have no {key!r}"
                f" (e.g. {missing[0]!r}): their samples carry reward null"
            )
        return
    known: set[str] = set()
    for s in selected:
        o = s.outcome
        if o is None:
            continue
        if isinstance(o.reward, dict):
            known.update(o.reward)
        known.update(
            k for k, v in o.metadata.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        )
        if isinstance(o.metadata.get("process_reward"), dict):
            known.add("process")
    raise usage_error(
        f"--reward-key {key}: no selected session has a reward named {key!r} (every reward would be null)",
        f"known here: {', '.join(sorted(known))}"
        if known
        else "no session has named rewards: set them with `orchard-rec outcome SID --reward-json ...`",
    )


# ``export``'s own options, one alias each: its signature keeps one line per parameter
_ExportFmt = Annotated[str, typer.Option("--format", "-f", help="Output format (see --list-formats).")]
_ExportOutArg = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        help="Output file; '-' is stdout (jsonl, slime-sft, openrlhf); a URL (s3://, gs://, file://) is a partitioned parquet dataset.",
    ),
]
_ExportTokenizer = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="HF tokenizer (path or 'demo') to give ids to calls recorded without them (passthrough).",
    ),
]
_ExportGroupBy = Annotated[
    str | None,
    typer.Option(
        "--group-by", help="Outcome metadata key whose value groups sessions (GRPO groups), or 'session'."
    ),
]
_ExportStatus = Annotated[
    list[str] | None,
    typer.Option("--status", metavar=StatusMetavar, help="Keep samples with this status (repeatable)."),
]
_ExportMinReward = Annotated[
    float | None, typer.Option("--min-reward", help="Keep samples whose scalar reward is at least this.")
]
_ExportPassRate = Annotated[
    str | None,
    typer.Option(
        "--pass-rate", help="LO:HI - keep groups whose pass rate is in [LO, HI] (needs --group-by)."
    ),
]
_ExportRolloutSize = Annotated[
    int | None,
    typer.Option(
        "--rollout-size",
        help="slime: samples per file (files out_0.pt, out_1.pt, ... or a {rollout_id} template).",
    ),
]
_ExportProcessor = Annotated[
    str | None,
    typer.Option(
        "--processor",
        help="slime: the model's image processor (model folder, hub id or 'demo') for samples with images.",
    ),
]
_ExportRewardKey = Annotated[
    str | None,
    typer.Option(
        "--reward-key",
        help="Which reward samples carry: 'process' (orchard-rec reward), a named reward, or an outcome metadata number.",
    ),
]
_ExportSelect = Annotated[
    str | None,
    typer.Option(
        "--select",
        help="bar:N:LO:HI[:STRIDE] - Balanced Adaptive Rollout: exactly N attempts per group, positives ratio in [LO, HI], tried on growing prefixes of STRIDE attempts (needs --group-by).",
    ),
]
_ExportFilters = Annotated[
    list[str] | None,
    typer.Option(
        "--filter",
        help="Dynamic-sampling filter per group (repeatable, applied in order): nonzero-std, no-aborted, no-truncated, has-positive, pass-rate, positive-only.",
    ),
]
_ExportSeed = Annotated[
    int | None,
    typer.Option("--seed", help="Seed for --select's tie order and --filter pass-rate (needs one of them)."),
]
_ExportRequireTeacher = Annotated[
    bool,
    typer.Option(
        "--require-teacher", help="Drop samples that have no stored teacher log-probs (orchard-rec teacher)."
    ),
]
_ExportListFormats = Annotated[bool, typer.Option("--list-formats", help="List the formats and exit.")]
_ExportStorageOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        help="For the filesystem of an --out URL, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable).",
    ),
]
_ExportEngine = Annotated[
    Literal["local", "ray"],
    typer.Option("--engine", help="ray: shard sessions over a Ray cluster (an --out URL; the ray extra)."),
]
_ExportRayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address", help="The Ray cluster for --engine ray (default: RAY_ADDRESS, else a local one)."
    ),
]
_ExportAuxiliary = Annotated[
    bool | None,
    typer.Option(
        "--auxiliary/--no-auxiliary",
        help="Keep samples of harnesses' side conversations (metadata.auxiliary, e.g. title generation); default: in jsonl/parquet only.",
    ),
]
_ExportForce = Annotated[bool, typer.Option("--force", help=FORCE_HELP)]
_ExportPolicyVersion = Annotated[
    int | None,
    typer.Option("--policy-version", help="The trainer's current policy version V (with --max-staleness K)."),
]
_ExportMaxStaleness = Annotated[
    int | None,
    typer.Option("--max-staleness", min=0, help="Tokens sampled by versions older than V - K are stale."),
]
_ExportMinPolicyVersion = Annotated[
    int | None,
    typer.Option("--min-policy-version", help="Tokens sampled by versions older than this are stale."),
]
_ExportStale = Annotated[
    Literal["drop", "mask"],
    typer.Option("--stale", help="drop samples holding stale tokens, or mask those tokens (loss mask 0)."),
]
_ExportAborted = Annotated[
    Literal["drop", "keep"],
    typer.Option(
        "--aborted",
        help="Generations the server aborted for a weight update (finish reason abort): left out, or kept with their partial tokens.",
    ),
]


def export(
    fmt: _ExportFmt = "jsonl",
    out_arg: _ExportOutArg = None,
    db: str = DbOpt,
    session: list[str] | None = SessionsOpt,
    since: datetime | None = SinceOpt,
    harness: str | None = HarnessOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    credit: Credit = CreditOpt,
    tokenizer: _ExportTokenizer = None,
    group_by: _ExportGroupBy = None,
    status: _ExportStatus = None,
    min_reward: _ExportMinReward = None,
    pass_rate: _ExportPassRate = None,
    rollout_size: _ExportRolloutSize = None,
    processor: _ExportProcessor = None,
    reward_key: _ExportRewardKey = None,
    select: _ExportSelect = None,
    filters: _ExportFilters = None,
    seed: _ExportSeed = None,
    require_teacher: _ExportRequireTeacher = False,
    list_formats: _ExportListFormats = False,
    storage_options: _ExportStorageOptions = None,
    engine: _ExportEngine = "local",
    ray_address: _ExportRayAddress = None,
    auxiliary: _ExportAuxiliary = None,
    force: _ExportForce = False,
    policy_version: _ExportPolicyVersion = None,
    max_staleness: _ExportMaxStaleness = None,
    min_policy_version: _ExportMinPolicyVersion = None,
    stale: _ExportStale = "drop",
    aborted: _ExportAborted = "drop",
) -> None:
    """Reconstruct sessions into training samples and write them in a trainer's format."""
    from orchard_rec.exporters.pipeline import export as run_export
    from orchard_rec.pipeline import SelectionStats
    from orchard_rec.policy import Staleness
    from orchard_rec.selection import Selection
    from orchard_rec.selection.staleness import StalenessStats

    if list_formats:
        _list_formats()
        return
    url, storage, out, window, bar = _check_export_options(
        fmt=fmt,
        out_arg=out_arg,
        storage_options=storage_options,
        engine=engine,
        ray_address=ray_address,
        db=db,
        force=force,
        rollout_size=rollout_size,
        processor=processor,
        pass_rate=pass_rate,
        group_by=group_by,
        status=status,
        select=select,
        filters=filters,
        seed=seed,
        policy_version=policy_version,
        max_staleness=max_staleness,
    )
    selection = Selection(
        sessions=session,
        since=_since(since),
        harness=harness,
        on_mismatch=on_mismatch,
        credit=credit,
        aborted=aborted,
        group_by=group_by,
        pass_rate=window,
        select=bar,
        filters=filters,
        seed=seed,
        statuses=status,
        min_reward=min_reward,
        reward_key=reward_key,
        auxiliary=auxiliary,
        require_teacher=require_teacher,
        staleness=Staleness(policy_version, max_staleness, min_policy_version),
        stale=stale,
    )
    tok = _load_tokenizer(tokenizer, hf=True) if tokenizer else None
    total = _select_sessions(db, selection)
    stale_stats, sel_stats = StalenessStats(), SelectionStats()
    stats = _run_with_progress(
        run_export if url is None else _url_export(url, storage, engine, ray_address),
        total,
        db,
        fmt,
        out,
        selection=selection,
        tokenizer=tok,
        format_options=_format_options(rollout_size, processor),
        selection_stats=sel_stats,
        check=lambda p: _check_output(p, db, force),
        staleness_stats=stale_stats,
    )
    _export_report(stats, selection, sel_stats, stale_stats, total, out, url)


def _format_options(rollout_size: int | None, processor: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {"rollout_size": rollout_size} if rollout_size else {}
    if processor is not None:
        options["processor"] = processor
    return options


def _export_report(
    stats: Any,
    selection: Selection,
    sel_stats: Any,
    stale_stats: Any,
    total: int,
    out: Path,
    url: str | None,
) -> None:
    """``export``'s closing lines on stderr; no sample written is an error naming the filters."""
    where = "stdout" if str(out) == "-" else ", ".join(map(str, stats.files)) or (url or str(out))
    selection_line = f"selection: {sel_stats.summary()}" if selection.chooses else None
    if stats.samples == 0:
        _nothing_exported(
            _filters_given(selection),
            total,
            "" if str(out) == "-" else f"; nothing written ({out} left as it was)",
            selection_line,
        )
    if selection_line:
        typer.echo(selection_line, err=True)
    if selection.staleness is not None:
        typer.echo(f"staleness: {stale_stats.summary()}", err=True)
    typer.echo(
        f"wrote {stats.samples} samples ({stats.tokens} tokens) from {total} sessions to {where}", err=True
    )


def _list_formats() -> None:
    from orchard_rec.exporters.base import available

    known = available()
    for name in sorted(known):
        ext, what = FORMAT_INFO.get(name) or ("", _format_doc(known[name]))
        typer.echo(f"{name:<10} {ext or '-':<9} {what}")


def _filters_given(selection: Selection) -> list[str]:
    """The options that filter samples or groups out, as ``export`` names them."""
    return [
        name
        for name, on in (
            ("--status", selection.statuses),
            ("--min-reward", selection.min_reward is not None),
            ("--pass-rate", selection.pass_rate is not None),
            ("--select", selection.select is not None),
            ("--filter", selection.filters),
            ("--require-teacher", selection.require_teacher),
            ("--no-auxiliary", selection.auxiliary is False),
            ("--policy-version/--max-staleness/--min-policy-version", selection.staleness is not None),
        )
        if on
    ]


def _check_export_options(
    *,
    fmt: str,
    out_arg: str | None,
    storage_options: list[str] | None,
    engine: str,
    ray_address: str | None,
    db: str,
    force: bool,
    rollout_size: int | None,
    processor: str | None,
    pass_rate: str | None,
    group_by: str | None,
    status: list[str] | None,
    select: str | None,
    filters: list[str] | None,
    seed: int | None,
    policy_version: int | None,
    max_staleness: int | None,
) -> tuple[str | None, dict[str, Any], Path, tuple[float, float] | None, Any]:
    """``export``'s options, checked before the database is opened: (the dataset URL or None, its
    storage options, ``--out``, the ``--pass-rate`` window, the ``--select`` bar)."""
    from orchard_rec.exporters.base import available

    known = available()
    if fmt not in known:
        raise usage_error(
            f"--format {fmt!r} is not a format", f"one of: {', '.join(sorted(known))} (--list-formats)"
        )
    if out_arg is None:
        raise usage_error("--out is required", f"e.g. --out samples{FORMAT_INFO.get(fmt, ('.out',))[0]}")
    url, storage = _dataset_out(out_arg, fmt, storage_options)
    if (engine == "ray" or ray_address) and url is None:
        raise usage_error("--engine ray writes a partitioned dataset: give --out URL (s3://..., file://...)")
    if ray_address and engine != "ray":
        raise usage_error("--ray-address is for --engine ray")
    out = Path(out_arg)
    if url is None:  # a dataset prefix: new names only, a non-dataset prefix refused (exporters.dataset)
        _check_out(fmt, out)
        if "{rollout_id}" not in str(out):
            _check_output(out, db, force)
    if rollout_size is not None and (fmt != "slime" or rollout_size < 1):
        raise usage_error("--rollout-size takes a positive number, for --format slime")
    if processor is not None and fmt != "slime":
        raise usage_error("--processor is for --format slime (its samples carry the processor's output)")
    if pass_rate and not group_by:
        raise usage_error("--pass-rate needs --group-by (a pass rate is a property of a group)")
    window = None
    _check_statuses(status)
    if pass_rate:
        try:
            lo, hi = (float(x) for x in pass_rate.split(":"))
        except ValueError:
            raise usage_error("--pass-rate takes LO:HI, e.g. 0.25:0.75") from None
        if not 0.0 <= lo <= hi <= 1.0:  # also nan
            raise usage_error(
                f"--pass-rate {pass_rate}: needs 0 <= LO <= HI <= 1", "e.g. --pass-rate 0.25:0.75"
            )
        window = (lo, hi)
    bar = None
    if select is not None:
        from orchard_rec.selection import parse_bar

        try:
            bar = parse_bar(select)
        except ValueError as e:
            raise usage_error(f"--{e}") from None
    if (bar is not None or filters) and not group_by:
        raise usage_error("--select and --filter need --group-by (they choose among a task's attempts)")
    from orchard_rec.selection import FILTERS

    for name in filters or ():
        if name not in FILTERS:
            raise usage_error(f"--filter {name!r} is not a filter", f"one of: {', '.join(FILTERS)}")
    if seed is not None and bar is None and "pass-rate" not in (filters or ()):
        raise usage_error(
            "--seed orders --select's ties and --filter pass-rate's draws: without either it changes nothing",
            "add --select bar:N:LO:HI or --filter pass-rate, or leave --seed out",
        )
    if (policy_version is None) != (max_staleness is None):
        raise usage_error(
            "--policy-version and --max-staleness go together", "e.g. --policy-version 12 --max-staleness 2"
        )
    return url, storage, out, window, bar


def _select_sessions(db: str, selection: Selection) -> int:
    """How many sessions ``export`` selects (warnings for what is missing; none is an error)."""
    session, since, harness = selection.sessions, selection.since, selection.harness
    with _reading(db) as store:
        selected = store.sessions(session, since=since, harness=harness)
        if session:
            missing = sorted(set(session) - {s.id for s in selected})
            if missing:
                _warn(f"no session {', '.join(map(repr, missing))} in {db}")
        if selection.group_by:
            _group_warning(store, selection, selection.group_by)
    if selection.reward_key is not None and selected:
        _reward_key_check(selected, selection.reward_key)
    total = len(selected)
    if total == 0:
        raise CliError(
            "nothing to export: no session matches the selection"
            if (session or since is not None or harness)
            else f"nothing to export: {db} has no sessions",
            None
            if not (session or since is not None or harness)
            else "list them with `orchard-rec sessions`",
        )
    return total


def _run_with_progress(write: Callable[..., Any], total: int, db: str, fmt: str, out: Path, **kw: Any) -> Any:
    """``write(db, fmt, out, ...)`` with a progress bar on stderr (a terminal only), one step a session."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("exporting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sessions"),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=True,
    )
    with progress:
        task = progress.add_task("export", total=total)
        return write(db, fmt, out, on_session=lambda _s: progress.advance(task), **kw)


def _nothing_exported(given: list[str], total: int, kept: str, selection_line: str | None) -> NoReturn:
    """No sample came out: say which options filtered everything (``given``), else why."""
    if given:
        raise CliError(
            f"no sample passed {', '.join(given)} ({total} sessions selected){kept}",
            selection_line or "loosen them; `orchard-rec sessions` shows each session's status and reward",
        )
    raise CliError(
        f"the {total} selected sessions gave no samples (no calls with token ids? try --tokenizer){kept}"
    )


@train_app.command("sft")
def train_sft_cmd(
    model: Path = typer.Option(..., "--model", help="A local Hugging Face causal LM folder."),
    out: Path = typer.Option(..., "--out", help="Where to save the trained checkpoint."),
    db: str = DbOpt,
    session: list[str] | None = SessionsOpt,
    credit: Credit = CreditOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps."),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="Samples per step."),
    lr: float = typer.Option(1e-4, "--lr", help="Learning rate."),
) -> None:
    """Credit-assignment SFT: train only on credited tokens of the recorded samples."""
    _check_output(out, db, True)  # a checkpoint folder: never the database (nor any SQLite file)
    from orchard_rec.signals import interrupt_deferred

    try:
        with interrupt_deferred():  # torch: Ctrl-C inside its import would abort the interpreter
            from transformers import AutoModelForCausalLM

            from orchard_rec.trainers.sft import train_sft
    except ImportError as exc:
        raise CliError(
            f"training needs torch and transformers ({exc})", "pip install 'orchard-rec[train,hf]'"
        ) from None
    from rich.progress import Progress

    from orchard_rec.pipeline import iter_samples
    from orchard_rec.reconstruct.credit import credit_policy
    from orchard_rec.selection import Selection

    if not model.is_dir():
        raise usage_error(f"--model {model}: no such folder")
    selection = Selection(sessions=session, credit=credit_policy(credit), on_mismatch=on_mismatch)
    with _reading(db) as store:
        samples = list(iter_samples(store, selection))
    if not samples:
        raise CliError("no samples to train on", "record sessions first, or check --session")
    lm = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
    with Progress(console=err, disable=not err.is_terminal) as progress:
        task = progress.add_task("sft", total=steps)

        def step(k: int, loss: float, n: int) -> None:
            progress.update(task, advance=1, description=f"sft loss {loss:.4f} ({n} credited tokens)")
            if not err.is_terminal:
                console.print(f"step {k} loss {loss:.4f} credited_tokens {n}")

        res = train_sft(lm, samples, steps=steps, batch_size=batch_size, lr=lr, out=out, on_step=step)
    console.print(
        f"trained {steps} steps on {len(samples)} samples, {res.credited_tokens} credited tokens; loss {res.losses[0]:.4f} -> {res.losses[-1]:.4f}; saved {out}"
    )
