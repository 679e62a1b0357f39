"""Score samples with a teacher server: bounded concurrency, retries, shards, resumable.

Each sample is identified by ``(session_id, sample_key, content_hash)``: the key is the
sample's first call id (stable across exports), the hash covers its token ids and
response length. A result already stored for the same key and hash is skipped; a changed
sample (new hash) or a failed one is scored again. ``shard=(i, n)`` keeps the samples
whose key hashes to ``i`` mod ``n``, so N workers split the work deterministically.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import struct
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import aiohttp

from orchard_rec.teacher.wire import TeacherResult, parse, request_for, window

__all__ = [
    "SampleRef",
    "TeacherConfig",
    "TeacherSink",
    "TeacherSummary",
    "content_hash",
    "in_shard",
    "run_coroutine",
    "score_all",
]

log = logging.getLogger("orchard_rec.teacher")
T = TypeVar("T")


@dataclass(frozen=True)
class SampleRef:
    session_id: str
    sample_key: str
    tokens: list[int]
    response_length: int

    @property
    def content_hash(self) -> str:
        return content_hash(self.tokens, self.response_length)


def content_hash(tokens: list[int], response_length: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<I", response_length))
    h.update(struct.pack(f"<{len(tokens)}i", *tokens))
    return h.hexdigest()


def in_shard(sample_key: str, shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    i, n = shard
    digest = hashlib.blake2b(sample_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n == i


@dataclass
class TeacherConfig:
    url: str
    """The server's root; a trailing ``/v1`` (the form ``serve --upstream`` takes) is dropped,
    since the routes (``/v1/completions``, ``/generate``) are added to the root."""
    kind: str = "vllm"
    top_k: int = 0
    max_len: int | None = None
    """Longest sequence sent; None: asked of the server (``/get_server_info``, ``/v1/models``)."""
    truncation: str = "prefix"
    concurrency: int = 8
    retries: int = 2
    timeout_s: float = 300.0
    model: str | None = None
    """The model name sent to vLLM (its ``/v1/models`` first entry when None)."""
    retokenize: tuple[Any, Any] | None = None
    """``(student tokenizer, teacher tokenizer)`` when the teacher's vocabulary differs: the
    response is mapped by text (``teacher.align``) and unaligned positions are invalid."""
    name: str | None = None
    """The teacher's recorded name/version (default: the model name the server reports)."""

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/").removesuffix("/v1")


class TeacherSink(Protocol):
    def stored_hash(self, session_id: str, sample_key: str) -> tuple[str, bool] | None:
        """``(content_hash, failed)`` of what is stored for the sample, or None."""

    def save(
        self, ref: SampleRef, result: TeacherResult, *, failed: bool, teacher: str, top_k: int
    ) -> None: ...


@dataclass
class TeacherSummary:
    samples: int = 0
    scored: int = 0
    skipped: int = 0
    failed: int = 0
    tokens: int = 0
    invalid_positions: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"teacher: {self.samples} samples ({self.scored} scored, {self.skipped} already done, "
            f"{self.failed} failed), {self.tokens} response tokens, {self.invalid_positions} positions not scored"
        )


async def _model_of(session: aiohttp.ClientSession, cfg: TeacherConfig) -> str | None:
    try:
        if cfg.kind == "vllm":
            async with session.get(cfg.url.rstrip("/") + "/v1/models") as r:
                data = await r.json(content_type=None)
                return str(data["data"][0]["id"])
        async with session.get(cfg.url.rstrip("/") + "/get_model_info") as r:
            data = await r.json(content_type=None)
            return str(data.get("model_path") or data.get("served_model_name"))
    except Exception:
        return None


async def _max_len_of(session: aiohttp.ClientSession, cfg: TeacherConfig) -> int | None:
    """The longest input the teacher accepts, as Orchard's ``on_policy_distillation.py``
    (``_fetch_teacher_max_len``) discovers it: SGLang's ``/get_server_info``
    ``max_req_input_len``, else ``/v1/models``' ``max_model_len``; minus one (SGLang rejects
    an input of exactly ``max_req_input_len``; vLLM needs room for the one token it generates).
    None when neither answers."""
    base = cfg.url.rstrip("/")
    for path, read in (
        ("/get_server_info", lambda d: d.get("max_req_input_len")),
        ("/v1/models", lambda d: d["data"][0].get("max_model_len")),
    ):
        try:
            async with session.get(base + path) as r:
                if r.status != 200:
                    continue
                found = read(await r.json(content_type=None))
        except Exception:
            continue
        if isinstance(found, int) and not isinstance(found, bool) and found > 2:
            return found - 1
    return None


async def _score_one(
    session: aiohttp.ClientSession, cfg: TeacherConfig, ref: SampleRef, model: str | None
) -> TeacherResult:
    if cfg.retokenize is not None:
        from orchard_rec.teacher.align import align, map_back

        a = align(cfg.retokenize[0], cfg.retokenize[1], ref.tokens, ref.response_length)
        inner = SampleRef(
            ref.session_id, ref.sample_key, a.teacher_ids, len(a.teacher_ids) - a.teacher_prompt_length
        )
        plain = TeacherConfig(**{**cfg.__dict__, "retokenize": None})
        return map_back(a, await _score_one(session, plain, inner, model))
    w = window(len(ref.tokens), len(ref.tokens) - ref.response_length, cfg.max_len, cfg.truncation)
    path, body = request_for(cfg.kind, ref.tokens, w, cfg.top_k, model)
    last: Exception | None = None
    for attempt in range(cfg.retries + 1):
        try:
            async with session.post(cfg.url.rstrip("/") + path, json=body) as r:
                if r.status >= 400:
                    text = (await r.text())[:300]
                    raise RuntimeError(f"teacher answered {r.status}: {text}")
                answer = await r.json(content_type=None)
            return parse(cfg.kind, answer, ref.tokens, w, cfg.top_k)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            last = exc
            if attempt < cfg.retries:
                await asyncio.sleep(0.2 * 2**attempt)
    raise RuntimeError(str(last))


async def score_all(
    refs: Iterable[SampleRef],
    cfg: TeacherConfig,
    sink: TeacherSink,
    *,
    shard: tuple[int, int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> TeacherSummary:
    """Score every sample of ``refs`` in the shard that is not done yet; results go to ``sink``."""
    summary = TeacherSummary()
    sem = asyncio.Semaphore(max(1, cfg.concurrency))
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = cfg.model or await _model_of(session, cfg)
        if cfg.max_len is None:  # as the fork: the server says how long an input may be
            found = await _max_len_of(session, cfg)
            if found is not None:
                cfg = replace(cfg, max_len=found)
        teacher = cfg.name or model or cfg.url
        pending: set[asyncio.Task[None]] = set()

        async def one(ref: SampleRef) -> None:
            async with sem:
                try:
                    result = await _score_one(session, cfg, ref, model)
                    failed = False
                except Exception as exc:
                    n = ref.response_length
                    result = TeacherResult([0.0] * n, [0] * n)
                    failed = True
                    summary.failed += 1
                    if len(summary.errors) < 20:
                        summary.errors.append(f"{ref.session_id}/{ref.sample_key}: {exc}")
                    # the summary carries the first errors; the caller reports them once
                    log.debug("teacher failed on %s/%s: %s", ref.session_id, ref.sample_key, exc)
                else:
                    summary.scored += 1
                summary.tokens += ref.response_length
                summary.invalid_positions += ref.response_length - sum(result.valid_mask)
                sink.save(ref, result, failed=failed, teacher=teacher, top_k=cfg.top_k)
                if progress is not None:
                    progress(1)

        for ref in refs:
            if not in_shard(ref.sample_key, shard):
                continue
            summary.samples += 1
            stored = sink.stored_hash(ref.session_id, ref.sample_key)
            if stored is not None and stored[0] == ref.content_hash and not stored[1]:
                summary.skipped += 1
                if progress is not None:
                    progress(1)
                continue
            task = asyncio.create_task(one(ref))
            pending.add(task)
            task.add_done_callback(pending.discard)
            if len(pending) >= cfg.concurrency * 4:  # bounded: refs stream, tasks don't pile up
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.gather(*pending)
    return summary


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code: ``asyncio.run`` here, or in a
    thread of its own when this thread already runs an event loop (a trainer, a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class MemorySink:
    """Results kept in memory (live scoring inside a trainer; nothing is ever skipped)."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, str], tuple[TeacherResult, bool, str]] = {}

    def stored_hash(self, session_id: str, sample_key: str) -> tuple[str, bool] | None:
        return None

    def save(self, ref: SampleRef, result: TeacherResult, *, failed: bool, teacher: str, top_k: int) -> None:
        self.results[(ref.session_id, ref.sample_key)] = (result, failed, teacher)


def score_live(samples: list[Any], cfg: TeacherConfig) -> TeacherSummary:
    """Score reconstructed samples now and attach ``TeacherData`` to each (failed ones get an
    all-zero valid mask). Runs its own event loop, in a thread when one is already running."""
    from orchard_rec.reconstruct.sample import TeacherData

    sink = MemorySink()
    refs = [SampleRef(s.session_id, s.sample_key, list(s.tokens), s.response_length) for s in samples]

    summary = run_coroutine(score_all(refs, cfg, sink))
    for s in samples:
        got = sink.results.get((s.session_id, s.sample_key))
        if got is not None:
            result, _failed, teacher = got
            s.teacher = TeacherData(
                result.log_probs, result.valid_mask, teacher, result.topk_ids, result.topk_logprobs
            )
    return summary
