"""The bundled demo: ``demo`` and ``demo upstream``."""

from __future__ import annotations

from pathlib import Path

import typer

from orchard_rec.cli.common import HELP_OPTIONS, HostOpt, ProxyMode, _check_port, console, err, usage_error
from orchard_rec.cli.sessions import _print_calls

demo_app = typer.Typer(
    context_settings=HELP_OPTIONS,
    rich_markup_mode=None,
    add_completion=False,
    invoke_without_command=True,
    help="The bundled demo: the whole loop (default), or its model server alone (`demo upstream`).",
)


# -- demo ------------------------------------------------------------------------------------------------------------


@demo_app.callback()
def demo(
    ctx: typer.Context,
    workdir: Path | None = typer.Option(
        None, "--workdir", help="Keep everything here (default: a temp folder, removed unless --keep)."
    ),
    mode: ProxyMode = typer.Option(
        "token", "--mode", help="The proxy's mode (tito uses the demo tokenizer)."
    ),
    keep: bool = typer.Option(False, "--keep", help="Keep the temp folder (its path is printed)."),
    vlm: bool = typer.Option(
        False, "--vlm", help="Vision-language variant: a GUI-like agent sends screenshots (last 3 kept)."
    ),
) -> None:
    """Run the whole loop on embedded defaults: demo upstream, proxy on SQLite, a scripted agent."""
    if ctx.invoked_subcommand is not None:
        return
    import shutil
    import tempfile

    from orchard_rec.demo.run import run_demo

    temp = workdir is None
    wd = workdir or Path(tempfile.mkdtemp(prefix="orchard-demo-"))
    try:
        with err.status("running the demo agent through the proxy..."):
            res = run_demo(wd, mode=mode, vlm=vlm)
        console.print(
            f"[bold]Recorded session[/bold] {res.session_id!r}: {len(res.calls)} calls in {res.db_url}"
        )
        _print_calls(res.calls)
        if vlm:
            console.print(f"The GUI agent sent {res.marker}")
            for s in res.samples:
                spans = s.metadata.get("image_spans") or []
                console.print(
                    f"sample {s.index}: {len(s.images)} image(s), image tokens per image "
                    f"{[b - a for a, b in spans]} (mask 0)"
                    + (
                        f", split: {s.metadata['images_dropped']} screenshot(s) dropped"
                        if s.metadata.get("images_dropped")
                        else ""
                    )
                )
        else:
            console.print(f"The agent's tool really ran: marker.txt = {res.marker!r}")
        from orchard_rec.demo.tokenizer import build_tokenizer
        from orchard_rec.render import render_sample

        for s in res.samples:
            console.print(render_sample(s, build_tokenizer(), prompt_chars=300))
        trained = sum(sum(s.loss_mask) for s in res.samples)
        console.print(
            f"Reconstructed {len(res.calls)} calls into {len(res.samples)} sample(s), {trained} trained tokens"
        )
        kind = (
            "slime rollout (torch.load-able, --load-debug-rollout-data)"
            if res.trainer_export.suffix == ".pt"
            else "parquet"
        )
        if temp and not keep:
            console.print(
                f"Wrote a jsonl export and a {kind}; the temp folder is removed (--keep or --workdir DIR keeps them)."
            )
        else:
            console.print(f"jsonl: {res.jsonl}\nTrainer export, {kind}: {res.trainer_export}")
            console.print(f"Explore: orchard-rec show {res.session_id} --db {res.db_url} --tokenizer demo")
    finally:
        if temp and not keep:
            shutil.rmtree(wd, ignore_errors=True)
        elif temp:
            typer.echo(f"kept: {wd}", err=True)


@demo_app.command("upstream")
def demo_upstream(
    host: str = HostOpt,
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    vlm: bool = typer.Option(
        False, "--vlm", help="Accept images and expand them into <|image_pad|> runs as Qwen2-VL does."
    ),
    min_pixels: int = typer.Option(
        56 * 56, "--min-pixels", min=1, help="--vlm: smallest resized image area."
    ),
    max_pixels: int = typer.Option(
        224 * 224, "--max-pixels", min=1, help="--vlm: largest resized image area."
    ),
) -> None:
    """Run the demo model server alone (vLLM-compatible, token ids, a scripted model): for the quick start."""
    from orchard_rec.demo.run import serve_upstream
    from orchard_rec.demo.vision import VisionConfig

    if min_pixels > max_pixels:
        raise usage_error(f"--min-pixels {min_pixels} is above --max-pixels {max_pixels}")
    _check_port(host, port)
    serve_upstream(
        host,
        port,
        vlm=vlm,
        vision=VisionConfig(min_pixels=min_pixels, max_pixels=max_pixels),
        ready=lambda p: err.print(
            f"demo upstream on http://{host}:{p}/v1 (scripted {'vision-language ' if vlm else ''}model, token ids); "
            f"try: orchard-rec serve --upstream http://{host}:{p}/v1   (Ctrl-C stops)"
        ),
    )
