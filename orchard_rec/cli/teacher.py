"""Teacher log-probs for recorded samples: ``teacher``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from orchard_rec.cli.common import (
    CliError,
    DbOpt,
    HarnessOpt,
    OnMismatch,
    OnMismatchOpt,
    SessionsOpt,
    SinceOpt,
    _check_upstream,
    _load_tokenizer,
    _reading,
    _since,
    _warn,
    err,
    open_write,
    usage_error,
)

if TYPE_CHECKING:
    from orchard_rec.teacher import TeacherSummary

# -- teacher log-probs (on-policy distillation) ---------------------------------------------------------------------


# ``teacher``'s own options, one alias each: its signature keeps one line per parameter
_TeacherUrl = Annotated[
    str,
    typer.Option("--url", help="Teacher server base URL (vLLM: http://HOST:PORT; SGLang: http://HOST:PORT)."),
]
_TeacherKind = Annotated[
    Literal["vllm", "sglang"],
    typer.Option("--kind", help="vllm (/v1/completions prompt_logprobs) or sglang (/generate)."),
]
_TeacherTopK = Annotated[
    int, typer.Option("--top-k", help="Also store the teacher's top-K log-probs per response token.")
]
_TeacherMaxLen = Annotated[
    int | None,
    typer.Option(
        "--max-len", help="Longest token sequence the teacher accepts (default: asked of the server)."
    ),
]
_TeacherTruncation = Annotated[
    Literal["prefix", "suffix"],
    typer.Option(
        "--truncation", help="Over --max-len: drop from the left (prompt first) or the right (response tail)."
    ),
]
_TeacherConcurrency = Annotated[int, typer.Option("--concurrency", help="Requests in flight.")]
_TeacherRetries = Annotated[
    int, typer.Option("--retries", help="Retries per sample before it is stored as failed.")
]
_TeacherTimeout = Annotated[float, typer.Option("--timeout", help="Seconds per request.")]
_TeacherShard = Annotated[
    str | None, typer.Option("--shard", help="I/N: this worker's share of the samples (0 <= I < N).")
]
_TeacherModel = Annotated[
    str | None, typer.Option("--model", help="Model name sent to vLLM (default: its first /v1/models entry).")
]
_TeacherName = Annotated[
    str | None, typer.Option("--name", help="The teacher's name/version as stored (default: the model name).")
]
_TeacherTokenizer = Annotated[
    str | None,
    typer.Option(
        "--tokenizer", help="The student's tokenizer (path or 'demo'); needed with --retokenize-teacher."
    ),
]
_TeacherRetokenizeTeacher = Annotated[
    str | None,
    typer.Option(
        "--retokenize-teacher",
        help="The teacher's tokenizer when its vocabulary differs: positions are mapped by text, unaligned ones invalid.",
    ),
]


def teacher(
    url: _TeacherUrl,
    kind: _TeacherKind = "vllm",
    top_k: _TeacherTopK = 0,
    max_len: _TeacherMaxLen = None,
    truncation: _TeacherTruncation = "prefix",
    concurrency: _TeacherConcurrency = 8,
    retries: _TeacherRetries = 2,
    timeout: _TeacherTimeout = 300.0,
    shard: _TeacherShard = None,
    model: _TeacherModel = None,
    name: _TeacherName = None,
    tokenizer: _TeacherTokenizer = None,
    retokenize_teacher: _TeacherRetokenizeTeacher = None,
    session: list[str] | None = SessionsOpt,
    since: datetime | None = SinceOpt,
    harness: str | None = HarnessOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    db: str = DbOpt,
) -> None:
    """Teacher log-probs of every response token of every sample, stored per sample (resumable)."""

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchard_rec.pipeline import iter_samples
    from orchard_rec.selection import Selection
    from orchard_rec.storage.queries import teacher_store
    from orchard_rec.teacher import SampleRef, TeacherConfig, score_all
    from orchard_rec.teacher.run import run_coroutine

    url = _check_upstream(
        url, "--url", openai_style=False
    )  # the server root: /v1/completions or /generate is added
    if top_k < 0 or concurrency < 1 or retries < 0 or (max_len is not None and max_len < 2):
        raise usage_error("--top-k >= 0, --concurrency >= 1, --retries >= 0 and --max-len >= 2")
    part = _shard(shard)
    selection = Selection(sessions=session, since=_since(since), harness=harness, on_mismatch=on_mismatch)
    with _reading(db) as store:
        total = len(store.sessions(selection.sessions, since=selection.since, harness=selection.harness))
    if total == 0:
        raise CliError(
            "no session to score"
            + (" matches the selection" if (session or since or harness) else f" in {db}")
        )
    store = open_write(db)
    sink = teacher_store(store)
    pair = None
    if retokenize_teacher is not None or tokenizer is not None:
        if retokenize_teacher is None or tokenizer is None:
            raise usage_error(
                "--retokenize-teacher TEACHER_TOKENIZER and --tokenizer STUDENT_TOKENIZER go together",
                "give both when the teacher's tokenizer differs; neither when it is the student's",
            )
        pair = (_load_tokenizer(tokenizer, hf=False), _load_tokenizer(retokenize_teacher, hf=False))
    cfg = TeacherConfig(
        retokenize=pair,
        url=url,
        kind=kind,
        top_k=top_k,
        max_len=max_len,
        truncation=truncation,
        concurrency=concurrency,
        retries=retries,
        timeout_s=timeout,
        model=model,
        name=name,
    )
    progress = Progress(
        TextColumn("teacher"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=True,
    )
    try:
        refs = (
            SampleRef(s.session_id, s.sample_key, list(s.tokens), s.response_length)
            for s in iter_samples(store, selection)
        )
        with progress:
            task = progress.add_task("teacher", total=None)
            summary = run_coroutine(
                score_all(refs, cfg, sink, shard=part, progress=lambda k: progress.advance(task, k))
            )
    finally:
        store.close()
    _teacher_report(summary, cfg.url, kind)


def _shard(shard: str | None) -> tuple[int, int] | None:
    """``--shard I/N`` → ``(I, N)``; None without it."""
    part: tuple[int, int] | None = None
    if shard is not None:
        try:
            i, n = (int(x) for x in shard.split("/"))
            if not 0 <= i < n:
                raise ValueError
        except ValueError:
            raise usage_error("--shard takes I/N with 0 <= I < N, e.g. 0/4") from None
        part = (i, n)
    return part


def _teacher_report(summary: TeacherSummary, url: str, kind: str) -> None:
    """The run's summary line and its first errors on stderr; exit 1 when a sample failed."""
    typer.echo(summary.line(), err=True)
    for e in summary.errors[:5]:
        _warn(e)
    if summary.failed:
        _warn(
            f"{summary.failed} samples failed (stored with an all-zero valid mask); run the command again to retry them"
        )
        if any(" 404" in e or "answered 404" in e for e in summary.errors):
            typer.echo(
                f"  the teacher answered 404: is --url {url} the server's root, and --kind {kind} right? "
                f"(vllm: POST /v1/completions, sglang: POST /generate)",
                err=True,
            )
        raise SystemExit(1)
