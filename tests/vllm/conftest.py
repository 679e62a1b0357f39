"""One real vLLM CPU server per test session, and a tap that records what it sent.

The venv comes from ``tests/vllm/install.sh`` (``~/.cache/orchard-rec/vllm``, built on first
use, reused after); the model is built offline here (``model.py``). Start-up takes 25-55 s,
so every test of this folder shares one server (``vllm_server``) and is marked ``vllm`` and
``slow``. ``ORCHARD_VLLM_URL="http://HOST:PORT;MODEL_DIR"`` points the tests at a server
already running (while developing), skipping the start-up.

``vlm_server`` (module-scoped, used by ``test_vlm.py``): a second server on the tiny random
Qwen2-VL of ``vlm_model.py`` (``ORCHARD_VLLM_VLM_URL`` to reuse a running one), ``vlm_tap`` its tap.

``Tap``: a loopback relay between orchard-rec and vLLM that keeps every request body it
forwarded and the exact bytes vLLM answered, so tests compare what was recorded and what
clients got against what vLLM really sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from factories import free_port

from orchard_rec.demo.tokenizer import save_tokenizer
from orchard_rec.dialects import assemble
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import Dialect

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("ORCHARD_VLLM_VENV", Path.home() / ".cache" / "orchard-rec" / "vllm"))
MODEL = "tiny-qwen2"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.slow)
            # the first test also waits for the server's start-up (25-55 s, minutes on a busy machine)
            item.add_marker(pytest.mark.timeout(1200))


@dataclass
class VLLMServer:
    url: str
    """Base URL with ``/v1``."""
    model_dir: Path
    startup_s: float
    tokenizer: Any


@contextmanager
def _vllm_process(model_dir: Path, served: str, args: list[str], logs: Path) -> Iterator[tuple[str, float]]:
    """A vLLM OpenAI server on ``model_dir`` (log in ``logs/vllm.log``): yields (root URL, start-up s).

    Started for a fast start-up: no torch.compile (``--enforce-eager``) and the model runs in the
    engine process, not a worker of its own (each vLLM process spends 15-35 s importing).
    """
    port = free_port()
    log = open(logs / "vllm.log", "wb")
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    env.pop("PYTHONPATH", None)
    cmd = [
        str(VENV / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
    ]
    cmd += ["--served-model-name", served, "--dtype", "float32", "--seed", "0", "--enforce-eager", *args]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("vLLM exited during start-up:\n" + (logs / "vllm.log").read_text()[-4000:])
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > t0 + 600:
                raise RuntimeError("vLLM did not start within 600 s")
            time.sleep(0.5)
        startup = time.monotonic() - t0
        sys.stderr.write(f"\n[vllm {served}] start-up {startup:.1f} s\n")
        (logs / "startup_seconds").write_text(f"{startup:.1f}\n")
        yield url, startup
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _served(url: str, model_dir: Path, startup: float) -> VLLMServer:
    """The server at root ``url`` serving ``model_dir``, with the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return VLLMServer(url.rstrip("/") + "/v1", model_dir, startup, tok)


def _running(var: str) -> VLLMServer | None:
    """The server already up that ``$var`` names (``http://HOST:PORT;MODEL_DIR``, while developing)."""
    running = os.environ.get(var)
    if not running:
        return None
    url, _, folder = running.partition(";")
    return _served(url, Path(folder), 0.0)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    running = _running("ORCHARD_VLLM_URL")
    if running is not None:
        yield running
        return
    subprocess.run(["bash", str(HERE / "install.sh"), str(VENV)], check=True)
    model_dir = tmp_path_factory.mktemp("vllm-model")
    save_tokenizer(model_dir)
    # the weights with the venv's own transformers, so vLLM reads the config it wrote
    subprocess.run([str(VENV / "bin" / "python"), str(HERE / "model.py"), str(model_dir)], check=True)
    args = ["--max-model-len", "4096", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with _vllm_process(model_dir, MODEL, args, model_dir) as (url, startup):
        yield _served(url, model_dir, startup)


@dataclass
class Exchange:
    path: str
    request: Any
    status: int
    body: bytes
    content_type: str

    def events(self) -> list[Any]:
        """The ``data:`` objects of a streamed answer (``[DONE]`` left out)."""
        return sse_events(self.body)

    def json(self) -> Any:
        return orjson.loads(self.body)


def sse_events(raw: bytes) -> list[Any]:
    """The ``data:`` objects of a server-sent event stream (``[DONE]`` left out)."""
    return [
        orjson.loads(line[6:])
        for line in raw.split(b"\n")
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]"
    ]


def vllm_answer(ex: Exchange) -> dict[str, Any]:
    """vLLM's chat completion (streamed answers assembled)."""
    if ex.content_type == "text/event-stream":
        return assemble(Dialect.CHAT, [(None, e) for e in ex.events()])
    return dict(ex.json())


def vllm_tokens(ex: Exchange) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, generated ids, logprobs) as vLLM sent them on its chat endpoint."""
    obj = vllm_answer(ex)
    c = obj["choices"][0]
    return obj["prompt_token_ids"], c["token_ids"], [e["logprob"] for e in c["logprobs"]["content"]]


def strip_injected(obj: dict[str, Any]) -> dict[str, Any]:
    """vLLM's chat answer (or chunk) as the client must get it: the fields token mode injected, nulled."""
    out = json.loads(json.dumps(obj))
    if "prompt_token_ids" in out:
        out["prompt_token_ids"] = None
    for c in out.get("choices") or ():
        for k in ("token_ids", "prompt_token_ids", "logprobs"):
            if k in c:
                c[k] = None
    return out


@dataclass
class Tap:
    url: str
    log: list[Exchange] = field(default_factory=list)


def _tap_app(target: str, tap: Tap) -> web.Application:
    async def relay(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            req: Any = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            req = raw
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as s,
            s.request(request.method, target + request.path_qs, data=raw or None, headers=headers) as up,
        ):
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    resp.headers[k] = v
            await resp.prepare(request)
            got = bytearray()
            async for chunk in up.content.iter_any():
                got += chunk
                await resp.write(chunk)
            # logged before the end of the body: the proxy has the answer only after it
            if request.method == "POST":  # the proxy's own GET /v1/models probes are not calls
                tap.log.append(Exchange(request.path, req, up.status, bytes(got), up.content_type))
            await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


@contextmanager
def _tap_on(server: VLLMServer) -> Iterator[Tap]:
    """A fresh tap in front of ``server``; its ``url`` ends in ``/v1``."""
    t = Tap("")
    srv = BackgroundServer(lambda: _tap_app(server.url[: -len("/v1")], t)).start()
    t.url = srv.url + "/v1"
    try:
        yield t
    finally:
        srv.stop()


@pytest.fixture
def tap(vllm_server: VLLMServer) -> Iterator[Tap]:
    """A fresh tap in front of the session's vLLM; its ``url`` ends in ``/v1``."""
    with _tap_on(vllm_server) as t:
        yield t


# -- the vision-language server (issue 21) ------------------------------------------------------

VLM_MODEL = "tiny-qwen2-vl"
VLM_MAX_IMAGES = 4
"""Images per prompt vLLM accepts (``--limit-mm-per-prompt``): the tests' clients keep at most 3."""


def _vlm_model_dir(scratch: Path) -> Path:
    """The built VLM, cached under ``~/.cache/orchard-rec/vllm-models`` by the content of what
    makes it (``vlm_model.py``, the demo tokenizer, the venv's transformers): built once (~10-30 s
    of imports), then reused. Built next to it and renamed into place, so concurrent runs never
    see half a model."""
    src = scratch / "tokenizer"
    save_tokenizer(src)
    key = hashlib.sha256((HERE / "vlm_model.py").read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        key.update((src / name).read_bytes())
    key.update(str(sorted(VENV.glob("lib/python3*/site-packages/transformers-*.dist-info"))).encode())
    cached = VENV.parent / "vllm-models" / f"qwen2-vl-{key.hexdigest()[:16]}"
    if (cached / "model.safetensors").is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".build-", dir=cached.parent))
    try:
        save_tokenizer(build)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run(
            [str(VENV / "bin" / "python"), str(HERE / "vlm_model.py"), str(build)], check=True, env=env
        )
        try:
            os.rename(build, cached)
        except OSError:  # another run renamed its build there first: the same content
            if not (cached / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return cached


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A real vLLM serving the tiny random Qwen2-VL of ``vlm_model.py``, for one test module.

    Module-scoped, so its start-up is paid once and it stops before later modules run. It may
    run beside the session's text server (each holds a 1 GiB KV cache; ~2.5 GB resident).
    ``ORCHARD_VLLM_VLM_URL="http://HOST:PORT;MODEL_DIR"`` uses a server already running.
    """
    running = _running("ORCHARD_VLLM_VLM_URL")
    if running is not None:
        yield running
        return
    subprocess.run(["bash", str(HERE / "install.sh"), str(VENV)], check=True)
    model_dir = _vlm_model_dir(tmp_path_factory.mktemp("vlm-build"))
    args = ["--max-model-len", "2048", "--limit-mm-per-prompt", f'{{"image": {VLM_MAX_IMAGES}, "video": 0}}']
    # the template iterates content parts; Hermes tool calls as the text model's
    args += [
        "--chat-template-content-format",
        "openai",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    # tito with images: vLLM's token-in endpoint POST /inference/v1/generate (ids + content_parts)
    args += ["--enable-scale-out"]
    logs = tmp_path_factory.mktemp("vlm-server")
    with _vllm_process(model_dir, VLM_MODEL, args, logs) as (url, startup):
        yield _served(url, model_dir, startup)


@pytest.fixture
def vlm_tap(vlm_server: VLLMServer) -> Iterator[Tap]:
    """A fresh tap in front of the module's VLM server; its ``url`` ends in ``/v1``."""
    with _tap_on(vlm_server) as t:
        yield t
