"""``orchard-rec demo``: the whole loop on embedded defaults, in a temp folder.

Starts the demo upstream and the proxy (SQLite) on loopback ports, drives the scripted
agent through ``/s/demo/v1`` with the real openai SDK, waits for the recorder, grades
the session (reward 1 when the agent's tool really wrote the marker file), reconstructs
it into samples and writes a jsonl export, plus a slime rollout file (torch installed)
or a parquet file. ``serve_upstream`` runs the demo upstream alone in the foreground
(``orchard-rec demo upstream``).

``vlm=True`` (``orchard-rec demo --vlm``) runs the vision-language variant instead: the upstream
expands image placeholders as Qwen2-VL does, and a GUI-like agent (``demo.gui``) sends Pillow
screenshots, keeping the last 3 in its history; the session reconstructs into one sample per
stretch of turns whose screenshots extend each other (``metadata.images_dropped`` where one
was dropped), each with its images and ``image_spans``. Graded 1 when the agent finished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchard_rec.demo.agent import run_agent
from orchard_rec.demo.gui import run_gui_agent
from orchard_rec.demo.tokenizer import IMAGE_PAD, build_tokenizer
from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.demo.vision import VisionConfig
from orchard_rec.exporters import ExportError, get
from orchard_rec.pipeline import Selection, iter_samples
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer, RecordingProxy, run_forever
from orchard_rec.reconstruct import Sample
from orchard_rec.records import CallRecord, Outcome
from orchard_rec.storage.store import Store

__all__ = ["DemoResult", "run_demo", "serve_upstream"]

SESSION = "demo"


@dataclass
class DemoResult:
    workdir: Path
    db_url: str
    session_id: str
    calls: list[CallRecord]
    marker: str
    samples: list[Sample]
    jsonl: Path
    trainer_export: Path
    """slime torch file when torch is installed, else generic parquet."""


def run_demo(workdir: Path, *, mode: str = "token", vlm: bool = False) -> DemoResult:
    workdir.mkdir(parents=True, exist_ok=True)
    sandbox = workdir / "sandbox"
    sandbox.mkdir(exist_ok=True)
    db_url = f"sqlite:///{workdir / 'orchard.db'}"
    upstream = DemoUpstream(vlm=vlm)
    finished = False
    with BackgroundServer(upstream.app()) as up:
        cfg = ProxyConfig.model_validate(
            {
                "upstream": up.url + "/v1",
                "db": db_url,
                "mode": mode,
                "tokenizer": "demo" if mode == "tito" else None,
            }
        )
        with RecordingProxy(cfg) as proxy:
            if vlm:
                gui = run_gui_agent(f"{proxy.url}/s/{SESSION}/v1")
                finished = not gui.messages[-1].get("tool_calls")
                (sandbox / "screens").mkdir(exist_ok=True)
                for k, png in enumerate(gui.shots):
                    (sandbox / "screens" / f"step{k}.png").write_bytes(png)
            else:
                run_agent(f"{proxy.url}/s/{SESSION}/v1", sandbox)
            proxy.flush()
    store = Store(db_url)
    try:
        success = finished if vlm else (sandbox / "marker.txt").exists()
        outcome = Outcome(reward=1.0 if success else 0.0, status="completed")
        store.set_outcome(SESSION, outcome)
        calls = store.calls(SESSION)
        pad = build_tokenizer().token_to_id(IMAGE_PAD) if vlm else None
        samples = list(iter_samples(store, Selection(sessions=[SESSION], image_token=pad)))
    finally:
        store.close()
    jsonl = workdir / "samples.jsonl"
    get("jsonl").write(samples, jsonl)
    try:
        trainer_export = workdir / "rollout_0.pt"
        slime = get("slime", processor="demo") if vlm else get("slime")  # needs torch (the train extra)
        slime.write(samples, trainer_export)
    except ExportError:
        trainer_export = workdir / "samples.parquet"
        get("parquet").write(samples, trainer_export)
    marker = (sandbox / "marker.txt").read_text().strip() if (sandbox / "marker.txt").exists() else ""
    if vlm:
        marker = f"{len(list((sandbox / 'screens').glob('*.png')))} screenshots in {sandbox / 'screens'}"
    return DemoResult(workdir, db_url, SESSION, calls, marker, samples, jsonl, trainer_export)


def serve_upstream(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    ready: Callable[[int], None] | None = None,
    vlm: bool = False,
    vision: VisionConfig | None = None,
) -> None:
    """The demo upstream in the foreground until Ctrl-C/SIGTERM (``vlm``: Qwen2-VL-style images)."""
    run_forever(DemoUpstream(vlm=vlm, vision=vision).app(), host, port, ready=ready, shutdown_timeout=5.0)
