"""Builders and small helpers for tests: call records (like mitmproxy's tflow), image data URLs,
free loopback ports, session base URLs, a raw JSON POST, ``orchard-rec serve`` in a subprocess, a
private copy of a recorded database, threads started together whose errors fail the test, the
bodies and captures of a growing session, waiting for a condition."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchard_rec.records import CallOutcome, CallRecord, Dialect


def call(
    session_id: str | None = "s1",
    *,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    logprobs: list[float] | None = None,
    dialect: Dialect = Dialect.CHAT,
    received_at: float | None = None,
    **kw: Any,
) -> CallRecord:
    t = received_at if received_at is not None else time.time()
    return CallRecord(
        call_id=kw.pop("call_id", uuid.uuid4().hex),
        session_id=session_id,
        dialect=dialect,
        method="POST",
        path="/v1/chat/completions",
        stream=kw.pop("stream", False),
        status_code=kw.pop("status_code", 200),
        outcome=kw.pop("outcome", CallOutcome.OK),
        received_at=t,
        first_byte_at=t + 0.001,
        done_at=t + 0.002,
        prompt_ids=None if prompt_ids is None else tuple(prompt_ids),
        completion_ids=None if completion_ids is None else tuple(completion_ids),
        completion_logprobs=None if logprobs is None else tuple(logprobs),
        **kw,
    )


def two_session_store(url: str, first: str = "alpha", second: str = "beta"):  # type: ignore[no-untyped-def]
    """A migrated store at ``url`` holding one call of each of two sessions (``first``: 2 prompt and
    2 completion tokens, ``second``: 1 and 1, with logprobs), left open for more writes."""
    from orchard_rec.storage import Store

    store = Store(url)
    store.upgrade()
    store.write_batch(
        [
            call(first, prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2]),
            call(second, prompt_ids=[5], completion_ids=[6], logprobs=[-0.3]),
        ]
    )
    return store


def check_invariants(calls, samples) -> None:  # type: ignore[no-untyped-def]
    """Invariants 1, 2 and 4 of reconstruction over recorded calls and their samples."""
    for (
        c
    ) in calls:  # (1) each generation verbatim, contiguous, in exactly one sample, mask 1, logprobs aligned
        [(s, t)] = [(s, t) for s in samples for t in s.turns if t.call_id == c.call_id]
        assert s.response_ids[t.start : t.end] == list(c.completion_ids)
        assert s.loss_mask[t.start : t.end] == [1] * len(c.completion_ids)
        assert s.rollout_log_probs[t.start : t.end] == list(c.completion_logprobs)
    for s in samples:  # (2) no mask-1 position the model did not generate
        gen = {i for t in s.turns for i in range(t.start, t.end)}
        assert {i for i, m in enumerate(s.loss_mask) if m} <= gen
    assert samples[0].prompt_ids == list(calls[0].prompt_ids)  # (4)


MARKER_TASK = "Please run `echo orchard > marker.txt` and tell me when it is done."
"""The harness tests' tool task (``check_steps`` checks the agent did it)."""


def check_steps(store, sid: str) -> None:  # type: ignore[no-untyped-def]
    """What the agent did, parsed from its own traffic (issue 19): the one shell command it was asked
    to run, in its harness's tool vocabulary, answered, not failed, writing the marker file."""
    from orchard_rec.recipes import session_steps

    steps, _turns = session_steps(store, sid)
    shell = [s for s in steps if s.kind == "shell"]
    assert len(shell) == 1, [s.to_dict() for s in steps]
    step = shell[0]
    assert step.command is not None and "echo orchard > marker.txt" in step.command
    assert "marker.txt" in step.edits and step.output is not None
    assert not step.failed and step.exit_code in (0, None)  # Claude Code says a code only on failure


def run_marker_task(harness, proxy, session_id: str | None, tmp_path: Path, run: str = ""):  # type: ignore[no-untyped-def]
    """``harness`` once on ``MARKER_TASK`` through ``proxy`` (``fake-model``; work dir and home
    ``work<run>`` and ``home<run>`` under ``tmp_path``), asserted to exit 0; the proxy flushed after."""
    from orchard_rec.harnesses import run_harness

    res = run_harness(
        harness,
        proxy.url,
        session_id,
        [MARKER_TASK],
        model="fake-model",
        workdir=tmp_path / f"work{run}",
        home=tmp_path / f"home{run}",
        timeout=300,
    )
    assert res.exit_code == 0, res.stderr[-3000:]
    proxy.flush()
    return res


def check_plain_url_run(harness, proxy, store, sid: str, tmp_path: Path) -> list[CallRecord]:  # type: ignore[no-untyped-def]
    """``harness`` run again with the proxy's plain base URL (no session in it): its calls (all but
    ``sid``'s), asserted to be one session of their own, under the harness's name, that reconstructs
    into one sample keeping invariants 1, 2 and 4."""
    from orchard_rec.reconstruct import reconstruct_session

    run_marker_task(harness, proxy, None, tmp_path, "2")
    other: list[CallRecord] = [c for c in store.calls() if c.session_id != sid]
    assert len(other) >= 2 and len({c.session_id for c in other}) == 1
    assert {c.harness for c in other} == {harness.name}
    [sample] = reconstruct_session(other, on_mismatch=harness.on_mismatch)
    check_invariants(other, [sample])
    return other


def run_threads(fn: Callable[[int], object], n: int) -> None:
    """``fn(0)`` ... ``fn(n - 1)``, each in its own thread, all released at once by a barrier (so
    they really overlap); returns when all are done, and fails the test with the first exception
    any of them raised (an exception in a plain thread would only be printed)."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        start.wait()
        try:
            fn(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,), name=f"run_threads-{k}") for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(f"{len(errors)} of {n} threads failed: {errors!r}") from errors[0]


def free_port() -> int:
    """A TCP port free on loopback now (for a server started in a subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def data_url(png: bytes) -> str:
    """``png`` as the ``data:image/png;base64,...`` URL clients send images inline as."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def session_base(url: str, sid: str, dialect: str) -> str:
    """The base URL a ``dialect`` SDK is given to record session ``sid`` through the proxy at ``url``
    (Anthropic's SDK adds ``/v1`` itself)."""
    return f"{url}/s/{sid}" + ("" if dialect == "messages" else "/v1")


def post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    """POST ``body`` as JSON; the answer's exact bytes (an HTTP error raises)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def post_status(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST ``body`` as JSON: ``(status, the answer's bytes)``, or for an HTTP error ``(status, its
    JSON body parsed)``, so a test can check the error's dialect."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def serve_process(
    port: int,
    upstream: str,
    db: str,
    *args: str,
    stdout: Any = subprocess.DEVNULL,
    stderr: Any = subprocess.DEVNULL,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``orchard-rec serve --upstream UPSTREAM --db DB --port PORT ARGS`` in a subprocess (in
    folder ``cwd``), returned once its ``/healthz`` answers 200 (with ``--workers N``: once all N
    answer; killed and an error raised if it exits or takes over 60 s)."""
    cmd = [
        sys.executable,
        "-m",
        "orchard_rec.cli",
        "serve",
        "--upstream",
        upstream,
        "--db",
        db,
        "--port",
        str(port),
    ]
    p = subprocess.Popen([*cmd, *args], stdout=stdout, stderr=stderr, cwd=cwd)
    workers = int(args[args.index("--workers") + 1]) if "--workers" in args else 1
    deadline = time.monotonic() + 60
    while True:
        if (workers_up(port) if workers > 1 else _healthy(port)) >= workers:
            return p
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise RuntimeError(f"orchard-rec serve did not start (exit code {p.poll()})")
        time.sleep(0.05)


def kill_all(pid: int) -> None:
    """``kill -9`` of a served proxy: the process, and with ``--workers`` its workers too (the
    parent stopped first, so that it neither restarts them nor tells them to drain)."""
    import os
    import signal

    os.kill(pid, signal.SIGSTOP)
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(x) for x in f.read().split()]
    for child in children:
        os.kill(child, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def _healthy(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return int(r.status == 200)
    except OSError:
        return 0


def workers_up(port: int) -> int:
    """How many workers of ``serve --workers N`` on ``port`` answer (``/metrics``, which asks every
    worker): 0 while none listens."""
    try:
        return int(metric_sum(port, "orchard_workers_answered"))
    except OSError:
        return 0


def metric_sum(port: int, name: str) -> float:
    """The sum of a ``/metrics`` sample over its labels (``worker`` included: the proxy's total)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


_REPEATED = {"api_keys": "--api-key", "admin_keys": "--admin-key", "fleet": "--upstream"}


def serve_args(**cfg: Any) -> tuple[list[str], dict[str, str]]:
    """``ProxyConfig`` keyword arguments as ``orchard-rec serve`` flags, and the environment they
    need (``upstream_key`` goes through ``--upstream-key-env``, as a user passes it)."""
    args: list[str] = []
    env: dict[str, str] = {}
    for name, value in cfg.items():
        if value is None:
            continue
        if name == "upstream_key":
            env["ORCHARD_TEST_UPSTREAM_KEY"] = value
            args += ["--upstream-key-env", "ORCHARD_TEST_UPSTREAM_KEY"]
        elif name in _REPEATED:
            for v in value:
                args += [_REPEATED[name], v]
        elif isinstance(value, bool):
            args += [f"--{name.replace('_', '-')}"] if value else []
        else:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args, env


class Served:
    """``orchard-rec serve --workers N`` in a subprocess, with the face of the in-process proxy
    fixture (``url``, ``flush``, ``store``): a reliability test can run against either. What it
    says on stderr is kept in ``log``."""

    def __init__(self, upstream: str, db: str, folder: Path, workers: int = 2, **cfg: Any) -> None:
        import os

        cfg.setdefault("spool", str(folder / "proxy.spool"))
        self.db, self.workers, self.log = db, workers, folder / "serve.log"
        self.port = free_port()
        args, env = serve_args(**cfg)
        extra = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with open(self.log, "ab") as err:
                self.proc = serve_process(
                    self.port, upstream, db, "--workers", str(workers), *args, stderr=err
                )
        finally:
            for k, v in extra.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def flush(self, timeout: float = 30.0) -> None:
        """Until every worker answers and none has a call in flight or a record not yet committed
        (or spooled), as the in-process recorder's ``flush``."""
        deadline = time.monotonic() + timeout
        while not (
            workers_up(self.port) == self.workers
            and metric_sum(self.port, "orchard_inflight_calls") == 0
            and metric_sum(self.port, "orchard_writer_queue_depth") == 0
        ):
            assert time.monotonic() < deadline, "the workers did not drain"
            time.sleep(0.02)

    def store(self) -> Any:
        from orchard_rec.storage import Store

        return Store(self.db)

    def stop(self) -> int:
        """SIGTERM (each worker drains), the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(60)


def copy_db(db: str, folder: Path) -> str:
    """A private copy of the SQLite database ``db`` (a URL) in ``folder``, for a test that writes to it."""
    dst = folder / "o.db"
    shutil.copy(db.removeprefix("sqlite:///"), dst)
    return f"sqlite:///{dst}"


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def _text(turn: int, n: int = 1000) -> str:
    return " ".join(WORDS[(turn * 7 + k * 3) % len(WORDS)] + str(k % 10) for k in range(n))


def growing_body(dialect: str, turns: int, stream: bool) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``(path, body, headers)`` of a session's call after ``turns`` exchanges (it grows each turn)."""
    hist: list[dict[str, Any]] = []
    for t in range(turns):
        hist.append({"role": "user", "content": f"turn {t}: {_text(t)}"})
        hist.append({"role": "assistant", "content": f"done with turn {t}"})
    hist.append({"role": "user", "content": f"turn {turns}: {_text(turns)}"})
    if dialect == "chat":
        return "v1/chat/completions", {"model": "m", "messages": hist, "stream": stream}, {}
    if dialect == "completions":
        prompt = "\n".join(m["content"] for m in hist)
        return "v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 24, "stream": stream}, {}
    if dialect == "responses":
        return "v1/responses", {"model": "m", "input": hist, "stream": stream}, {}
    return (
        "v1/messages",
        {"model": "m", "max_tokens": 64, "messages": hist, "stream": stream},
        {"anthropic-version": "2023-06-01"},
    )


def growing_capture(sid: str, turn: int, *, broken: bool = False) -> Any:
    """Call ``turn`` of a growing chat session as the proxy captures it: a request of 6 kB and
    more, an answer whose prompt ids extend the previous call's (each a base of the next capture
    line). ``broken``: its record cannot be built (``tokens`` of the wrong shape: ``to_record``
    raises, the capture line is fine)."""
    import orjson

    from orchard_rec.proxy.capture import Capture

    msgs = [{"role": "user", "content": f"turn {k} " + "w" * 6000} for k in range(turn + 1)]
    raw = orjson.dumps({"model": "m", "messages": msgs})
    ids = list(range(1000, 5000 + 100 * turn))
    answer = (
        b'{"id":"x","choices":[{"message":{"content":"ok"}}],"prompt_token_ids":[%s]}'
        % ",".join(map(str, ids)).encode()
    )
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", sid)
    cap.request_raw, cap.request, cap.bytes_in = raw, orjson.loads(raw), len(raw)
    cap.status_code, cap.body, cap.bytes_out = 200, answer, len(answer)
    if broken:
        cap.tokens = ("not", "four")
    return cap


def rejected_ids(path: Path) -> set[str]:
    """The call ids of a spool's ``.rejected`` file."""
    if not path.exists():
        return set()
    return {json.loads(line)["call_id"] for line in path.read_bytes().splitlines()}


def wait_for(pred: Callable[[], object], timeout: float = 10.0) -> None:
    """Until ``pred()`` is true (an assertion error after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def check_stored_as_written(store: Any, sid: str, live: list[CallRecord], ref_db: Path) -> None:
    """Session ``sid`` reads back from ``store`` as ``live`` (the records the writer thread would
    have built) read back after a plain ``write_batch`` into a fresh database at ``ref_db``."""
    from orchard_rec.storage import Store

    ref = Store(f"sqlite:///{ref_db}")
    ref.upgrade()
    ref.write_batch(live)
    got, want = store.calls(sid), ref.calls(sid)
    assert [c.call_id for c in got] == [c.call_id for c in want] == [r.call_id for r in live]
    for g, w in zip(got, want, strict=True):
        assert g == w, g.call_id
    assert got[-1].prompt_ids and got[-1].completion_ids
    ref.close()


PACED_GAP_S = 0.04
"""The pause between the frames of ``paced_stream_upstream``'s answer."""
PACED_SECRETS = ("cookie-SECRET", "token-SECRET", "key-SECRET", "bearer-SECRET")


def paced_stream_upstream() -> Any:
    """An aiohttp app answering ``POST /v1/chat/completions`` with a chat stream of 4 events plus
    ``[DONE]``, written as 4 frames ``PACED_GAP_S`` apart (one event split over two frames, two
    in one), and response headers that carry secrets (``PACED_SECRETS``) beside public ones."""
    import asyncio

    from aiohttp import web

    def chunk(i: int, text: str, finish: str | None = None) -> bytes:
        delta = {"role": "assistant", "content": text} if i == 0 else {"content": text}
        obj = {
            "id": "chatcmpl-paced",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "paced",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    e0, e1, e2, e3 = chunk(0, "one"), chunk(1, " two"), chunk(2, " three"), chunk(3, "", "stop")
    frames = [e0, e1[:20], e1[20:] + e2, e3 + b"data: [DONE]\n\n"]

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Set-Cookie": f"sid={PACED_SECRETS[0]}; Path=/",
                "X-Session-Token": PACED_SECRETS[1],
                "X-Api-Key": PACED_SECRETS[2],
                "Authorization": f"Bearer {PACED_SECRETS[3]}",
                "X-Request-Id": "req-paced-1",
                "X-Ratelimit-Remaining-Tokens": "9999",
                "Openai-Processing-Ms": "7",
                "X-Long": "v" * 5000,
            }
        )
        await resp.prepare(request)
        for i, f in enumerate(frames):
            if i:
                await asyncio.sleep(PACED_GAP_S)
            await resp.write(f)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def check_paced_record(c: CallRecord) -> None:
    """``c``, a call recorded from ``paced_stream_upstream`` through the proxy: one arrival per
    event, in order, inside the first/last byte window, the frames' pauses between them; the
    response headers kept without their secrets, bounded."""
    at = c.metadata["event_ms"]
    assert c.stream and c.events is not None and len(c.events) == 5 == len(at)
    assert all(isinstance(ms, int) for ms in at) and at == sorted(at)
    first, last = (c.first_byte_at - c.received_at) * 1000, (c.done_at - c.received_at) * 1000  # type: ignore[operator]
    assert first - 1 <= at[0] and at[-1] <= last + 1, (first, at, last)
    # event 0 in frame 0; 1 completed by frame 2 with 2; 3 and [DONE] in frame 3
    gap = PACED_GAP_S * 1000
    assert at[1] == at[2] and at[3] == at[4], at
    assert at[1] - at[0] >= 2 * gap - 5 and at[3] - at[2] >= gap - 5, at
    h = c.metadata["response_headers"]
    assert h["x-request-id"] == "req-paced-1" and h["openai-processing-ms"] == "7"
    assert h["x-ratelimit-remaining-tokens"] == "9999" and h["content-type"] == "text/event-stream"
    assert len(h["x-long"]) == 512
    assert not {"set-cookie", "x-session-token", "x-api-key", "authorization"} & set(h)
    assert not any(s in json.dumps(dict(c.metadata)) for s in PACED_SECRETS)
