"""slime plug-ins with slime's own signatures (read from THUDM/slime).

- ``generate_rollout(args, rollout_id, data_source, evaluation=False)`` for
  ``--rollout-function-path``: offline replay of recorded harness traffic. It serves
  ``args.rollout_batch_size`` groups per rollout id (groups as the exporters make them:
  ``--group-by`` key ``args.orchard_group_by``, default one group per session), each a
  list of slime ``Sample`` objects, i.e. slime's ``list[list[Sample]]``. The database is
  ``args.orchard_db`` or ``$ORCHARD_DB``; ``args.orchard_on_mismatch`` and
  ``args.orchard_credit`` pick the reconstruction policies. With ``args.orchard_teacher_url``
  the samples get the teacher's log-probs live (``teacher_log_probs`` as Orchard's OPD
  reads them, ``teacher_valid_mask``): ``args.orchard_teacher_kind`` (``sglang`` default,
  or ``vllm``), ``orchard_teacher_top_k``, ``orchard_teacher_max_len``,
  ``orchard_teacher_truncation``. Asynchronous RL: ``args.orchard_policy_version`` with
  ``args.orchard_max_staleness`` (and/or ``orchard_min_policy_version``) drops samples holding
  tokens of older policy versions, or masks those tokens (``orchard_stale``: ``drop`` default,
  ``mask``), as ``export --policy-version/--max-staleness/--stale`` does, and logs what it did;
  ``orchard_aborted`` (``drop`` default, ``keep``) decides on generations the server aborted.
- ``async generate(args, sample, sampling_params)`` for ``--custom-generate-function-path``
  (slime/rollout/sglang_rollout.py awaits it with these three arguments): runs one harness
  session (``args.orchard_harness``, default ``codex``) through a recording proxy whose
  upstream is slime's own router (``args.sglang_router_ip``/``port``, OpenAI API under
  ``/v1``), with ``sample.prompt`` as the task, and returns the sample filled from the
  reconstruction: ``tokens``, ``response_length``, ``loss_mask``, ``rollout_log_probs``,
  ``status`` and ``metadata`` (session id, call ids, harness exit code).
Samples are slime's own class when slime is importable, else the field-compatible
stand-in (``exporters.contracts.SlimeSample``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import uuid
from typing import Any

from orchard_rec.exporters.contracts import slime_runs, slime_sample_class, to_slime_dict
from orchard_rec.pipeline import iter_samples
from orchard_rec.policy import Staleness
from orchard_rec.reconstruct import Sample
from orchard_rec.selection import Selection
from orchard_rec.selection.staleness import StalenessStats
from orchard_rec.storage.store import Store

__all__ = ["generate", "generate_rollout", "rollout_selection", "to_slime_sample"]

log = logging.getLogger("orchard_rec.trainers.slime")


def _opt(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, None) if getattr(args, name, None) is not None else default


def _int(args: Any, name: str) -> int | None:
    v = _opt(args, name)
    return None if v is None else int(v)


def to_slime_sample(s: Sample, group_id: int | None = None) -> Any:
    return slime_sample_class().from_dict(to_slime_dict(s, prompt=s.messages_prompt(), group_id=group_id))


def rollout_selection(args: Any) -> Selection:
    """The samples ``generate_rollout`` serves, from slime's ``args`` (``orchard_*`` options)."""
    return Selection(
        group_by=_opt(args, "orchard_group_by", "session"),
        on_mismatch=_opt(args, "orchard_on_mismatch", "split"),
        credit=_opt(args, "orchard_credit", "assistant"),
        aborted=_opt(args, "orchard_aborted", "drop"),
        staleness=Staleness(
            _int(args, "orchard_policy_version"),
            _int(args, "orchard_max_staleness"),
            _int(args, "orchard_min_policy_version"),
        ),
        stale=_opt(args, "orchard_stale", "drop"),
    )


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any = None, evaluation: bool = False
) -> list[list[Any]]:
    """Groups ``rollout_id * batch .. (rollout_id + 1) * batch`` of the recorded sessions."""
    db = _opt(args, "orchard_db", os.environ.get("ORCHARD_DB", "sqlite:///./orchard.db"))
    batch = int(_opt(args, "rollout_batch_size", 1))
    selection = rollout_selection(args)
    store = Store(db)
    try:
        stale_stats = StalenessStats()
        samples = iter_samples(store, selection, staleness_stats=stale_stats)
        groups = (
            list(g) for _, g in itertools.groupby(slime_runs(samples), key=lambda sr: sr[0].group_index)
        )
        wanted = list(itertools.islice(groups, rollout_id * batch, (rollout_id + 1) * batch))
        if selection.staleness is not None:
            log.info("orchard-rec rollout %s: staleness: %s", rollout_id, stale_stats.summary())
        teacher_url = _opt(args, "orchard_teacher_url")
        if teacher_url:
            from orchard_rec.teacher import TeacherConfig, score_live

            score_live(
                [s for group in wanted for s, _ in group],
                TeacherConfig(
                    url=teacher_url,
                    kind=_opt(args, "orchard_teacher_kind", "sglang"),
                    top_k=int(_opt(args, "orchard_teacher_top_k", 0)),
                    max_len=_opt(args, "orchard_teacher_max_len"),
                    truncation=_opt(args, "orchard_teacher_truncation", "prefix"),
                ),
            )
        return [[to_slime_sample(s, run) for s, run in group] for group in wanted]
    finally:
        store.close()


_proxies: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def _proxy_for(upstream: str, db: str) -> str:
    """One recording proxy per (upstream, database) in this process, started on first use."""
    from orchard_rec.proxy import ProxyConfig
    from orchard_rec.proxy.server import RecordingProxy

    with _lock:
        server = _proxies.get((upstream, db))
        if server is None:
            server = RecordingProxy(ProxyConfig(upstream=upstream, db=db, mode="token")).start()
            _proxies[(upstream, db)] = server
        return str(server.url)


def _flush(proxy_url: str) -> None:
    for server in _proxies.values():
        if server.url == proxy_url:
            server.flush()


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    from orchard_rec.harnesses import get as get_harness
    from orchard_rec.harnesses import run_harness
    from orchard_rec.reconstruct import reconstruct_session

    upstream = (
        _opt(args, "orchard_upstream") or f"http://{args.sglang_router_ip}:{args.sglang_router_port}/v1"
    )
    db = _opt(args, "orchard_db", os.environ.get("ORCHARD_DB", "sqlite:///./orchard.db"))
    harness = get_harness(_opt(args, "orchard_harness", "codex"))
    proxy = _proxy_for(upstream, db)
    sid = f"slime-{uuid.uuid4().hex[:12]}"
    prompt = (
        sample.prompt
        if isinstance(sample.prompt, str)
        else "\n".join(m.get("content", "") for m in sample.prompt if isinstance(m, dict))
    )
    res = await asyncio.to_thread(
        run_harness,
        harness,
        proxy,
        sid,
        [prompt],
        model=_opt(args, "orchard_model", "default"),
        timeout=float(_opt(args, "orchard_timeout", 600)),
    )
    await asyncio.to_thread(_flush, proxy)
    store = Store(db)
    try:
        calls = store.calls(sid)
    finally:
        store.close()
    built = reconstruct_session(calls, on_mismatch=_opt(args, "orchard_on_mismatch", harness.on_mismatch))
    status_cls = type(sample.status)
    if not built:
        sample.status = status_cls("failed")
        sample.metadata = {
            **(sample.metadata or {}),
            "orchard_session": sid,
            "harness_exit_code": res.exit_code,
        }
        return sample
    main = max(built, key=lambda s: len(s.turns))  # the harness's main line (sub-agents aside)
    sample.tokens = list(main.tokens)
    sample.response_length = main.response_length
    sample.loss_mask = list(main.loss_mask)
    sample.rollout_log_probs = list(main.rollout_log_probs)
    sample.status = status_cls(str(main.status) if res.exit_code == 0 else "failed")
    sample.metadata = {
        **(sample.metadata or {}),
        **main.to_dict()["metadata"],
        "orchard_session": sid,
        "harness_exit_code": res.exit_code,
        "samples_in_session": len(built),
    }
    return sample
