"""Checking samples against a model: ``verify``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer

from orchard_rec.cli.common import (
    DbOpt,
    HarnessOpt,
    OnMismatch,
    OnMismatchOpt,
    SessionsOpt,
    SinceOpt,
    _since,
    _warn,
    open_read,
    usage_error,
)

# -- verify: the trainer's log-probs against the sampler's (issue 42) ----------------------------------------------


def verify(
    model: str = typer.Option(
        ..., "--model", help="The policy as Hugging Face transformers loads it (folder or hub name)."
    ),
    source: Path | None = typer.Option(
        None,
        "--input",
        "-i",
        help="An export file (.jsonl, .parquet, slime .pt); default: the samples of the database.",
    ),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N)."),
    max_samples: int | None = typer.Option(None, "--max-samples", help="Check at most N samples."),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        help="Per-token tolerance in nats (default by --dtype: float32 1e-3, bfloat16 0.2, float16 0.1).",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per sample, then the summary."),
    session: list[str] | None = SessionsOpt,
    since: datetime | None = SinceOpt,
    harness: str | None = HarnessOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    db: str = DbOpt,
) -> None:
    """Recompute every sample's log-probs with transformers (teacher forcing) and compare them with
    the recorded rollout log-probs on trained positions. Exit 1 when a sample is misaligned."""
    from orchard_rec.selection import Selection
    from orchard_rec.verify.command import run as run_verify

    if source is not None and (since is not None or harness is not None):
        raise usage_error("--since and --harness select from the database; with --input use --session")
    report = run_verify(
        model=model,
        source=source,
        open_store=lambda: open_read(db),
        selection=Selection(sessions=session, since=_since(since), harness=harness, on_mismatch=on_mismatch),
        dtype=dtype,
        device=device,
        max_samples=max_samples,
        tolerance=tolerance,
        as_json=as_json,
        echo=typer.echo,
    )
    if report.misaligned:
        _warn(
            f"{report.misaligned} samples misaligned: their tokens, mask or log-probs do not match what was sampled"
        )
        raise SystemExit(1)
