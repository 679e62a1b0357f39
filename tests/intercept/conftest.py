"""Intercept fixtures: a TLS upstream with a self-signed certificate, and ``orchard-rec intercept``
running as its own process (from the mitmproxy runtime venv when this Python has no mitmproxy)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.intercept import runtime
from orchard_rec.proxy import BackgroundServer


@pytest.fixture(scope="session")
def intercept_cmd() -> list[str]:
    """How to run ``orchard-rec``: here if this Python has mitmproxy, else the runtime venv (built once)."""
    if runtime.has_mitmproxy():
        return [sys.executable, "-c", "from orchard_rec.cli import main; main()"]
    return [str(runtime.install())]


@pytest.fixture(scope="session")
def test_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def test_ca_file(test_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "test-ca.pem"
    test_ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="session")
def mitm_confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mitmproxy CA for the test session (created by the first intercept start)."""
    return tmp_path_factory.mktemp("mitm")


@dataclass
class TlsUpstream:
    server: BackgroundServer
    fake: DemoUpstream
    host: str = "localhost"

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.server.port}/v1"


@pytest.fixture
def tls_upstream(test_ca: trustme.CA) -> Iterator[TlsUpstream]:
    """The vLLM-faithful demo server over HTTPS, with a certificate for ``localhost`` signed by a
    throwaway CA that only the intercept process is told to trust."""
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    test_ca.issue_cert("localhost").configure_cert(ctx)
    fake = DemoUpstream()
    srv = BackgroundServer(fake.app(), ssl_context=ctx).start()
    yield TlsUpstream(srv, fake)
    srv.stop()


@dataclass
class Intercept:
    proc: subprocess.Popen[str]
    url: str
    confdir: Path
    db: str
    log: list[str] = field(default_factory=list)

    @property
    def ca_cert(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def stop(self) -> int:
        """SIGTERM: the recorder drains before the process exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode


@pytest.fixture
def intercept_factory(
    intercept_cmd: list[str], mitm_confdir: Path, tmp_path: Path
) -> Iterator[Callable[..., Intercept]]:
    started: list[Intercept] = []

    def start(db: str, *args: str) -> Intercept:
        cmd = [
            *intercept_cmd,
            "intercept",
            "--listen",
            "127.0.0.1:0",
            "--db",
            db,
            "--confdir",
            str(mitm_confdir),
            "--spool",
            str(tmp_path / f"intercept{len(started)}.spool"),
            *args,
        ]
        env = {
            k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")
        }
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: queue.Queue[str | None] = queue.Queue()
        log: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                proc.kill()
                raise RuntimeError("intercept did not start within 60 s:\n" + "".join(log)) from None
            if line is None:
                raise RuntimeError("intercept exited at start:\n" + "".join(log))
            if "listening on http://" in line:
                url = line.split("listening on ", 1)[1].split()[0]
                break
        it = Intercept(proc, url, mitm_confdir, db, log)
        started.append(it)
        return it

    yield start
    for it in started:
        it.stop()


@pytest.fixture
def via(monkeypatch: pytest.MonkeyPatch) -> Callable[[Intercept], None]:
    """Make this process's HTTP clients use ``it`` as HTTPS proxy and trust its CA, as a harness would."""

    def use(it: Intercept) -> None:
        for k in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", it.url)
        monkeypatch.setenv("SSL_CERT_FILE", str(it.ca_cert))

    return use
