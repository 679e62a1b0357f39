"""Bad input never breaks the proxy: random and mutated bodies for each dialect (hypothesis),
invalid UTF-8, deep and huge JSON, wrong types, header injection, path traversal in session
ids, and schemathesis against the proxy's own OpenAPI description. Zero 5xx originating in
the proxy, zero hangs; every rejected request gets an error in its dialect's shape."""

from __future__ import annotations

import json
import socket

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.slow, pytest.mark.network]  # hypothesis and schemathesis against a live proxy

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "model",
        "messages",
        "input",
        "prompt",
        "stream",
        "tools",
        "max_tokens",
        "system",
        "instructions",
        "tool_choice",
        "content",
        "role",
    ]
)
bodies = st.dictionaries(keys, json_values, max_size=6) | st.fixed_dictionaries(
    {
        "model": st.text(max_size=5),
        "messages": st.lists(
            st.dictionaries(
                st.sampled_from(["role", "content", "tool_calls", "tool_call_id"]), json_values, max_size=4
            ),
            max_size=4,
        ),
    },
    optional={"stream": st.booleans(), "max_tokens": json_values, "tools": st.lists(json_values, max_size=3)},
)


def _raw(port: int, data: bytes, timeout: float = 10) -> tuple[int, bytes]:
    """Raw HTTP/1.1 over a socket, so nothing client-side sanitises what we send."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def _req(path: str, body: bytes, extra: str = "", ctype: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode() + body


def _start(mode: str, d):  # type: ignore[no-untyped-def]
    from orchard_rec.demo.upstream import DemoUpstream
    from orchard_rec.proxy import BackgroundServer, ProxyConfig, build_app

    up = BackgroundServer(DemoUpstream().app()).start()
    cfg = ProxyConfig(
        upstream=up.url + "/v1",
        db=f"sqlite:///{d / 'f.db'}",
        spool=str(d / "f.spool"),
        mode=mode,
        max_body_bytes=1 << 20,
    )
    return up, BackgroundServer(lambda: build_app(cfg)).start()


@pytest.fixture(scope="module", params=["token", "passthrough", "token-workers2"])
def fuzz_proxy(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    if request.param == "token-workers2":  # ``serve --workers 2``: the same answers from either worker
        from factories import Served

        from orchard_rec.demo.upstream import DemoUpstream
        from orchard_rec.proxy import BackgroundServer

        up = BackgroundServer(DemoUpstream().app()).start()
        d = tmp_path_factory.mktemp("fuzz")
        served = Served(up.url + "/v1", f"sqlite:///{d / 'f.db'}", d, 2, mode="token", max_body_mb=1)
        yield served
        assert served.stop() == 0 and "Traceback" not in served.log.read_text()
        up.stop()
        return
    up, proxy = _start(request.param, tmp_path_factory.mktemp("fuzz"))
    yield proxy
    proxy.stop()
    up.stop()


@pytest.fixture(scope="module")
def token_proxy(tmp_path_factory):  # type: ignore[no-untyped-def]
    up, proxy = _start("token", tmp_path_factory.mktemp("openapi"))
    yield proxy
    proxy.stop()
    up.stop()


def _check(status: int, body: bytes, path: str) -> None:
    assert status != 0, "no HTTP answer"
    assert status < 500, (status, body[:300])
    if status >= 400 and body.startswith(b"{"):
        err = json.loads(body)
        if "messages" in path:
            assert err.get("type") == "error" or "error" in err
        else:
            assert "error" in err


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_random_bodies_never_5xx(fuzz_proxy, route, body) -> None:  # type: ignore[no-untyped-def]
    status, out = _raw(fuzz_proxy.port, _req(route, json.dumps(body).encode()))
    _check(status, out, route)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), blob=st.binary(max_size=200))
def test_random_bytes_never_5xx(fuzz_proxy, route, blob) -> None:  # type: ignore[no-untyped-def]
    status, out = _raw(fuzz_proxy.port, _req(route, blob))
    _check(status, out, route)


@pytest.mark.parametrize("route", ROUTES)
def test_hostile_inputs(fuzz_proxy, route) -> None:  # type: ignore[no-untyped-def]
    port = fuzz_proxy.port
    cases = [
        b'\xff\xfe\xfd{"model": "m"}',  # invalid UTF-8
        b"[" * 5000 + b"]" * 5000,  # deeply nested
        json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x" * 900_000}]}
        ).encode(),  # near the limit
        json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x" * 2_000_000}]}
        ).encode(),  # over it
        json.dumps(
            {
                "model": 5,
                "messages": "no",
                "input": 7,
                "prompt": [None],
                "max_tokens": "many",
                "stream": False,
            }
        ).encode(),
    ]
    for body in cases:
        status, out = _raw(port, _req(route, body), timeout=20)
        _check(status, out, route)
    status, _ = _raw(port, _req(route, b"{}", ctype="text/plain"))
    assert status == 415
    for sid in ("..%2F..%2Fetc", "a/../../b", "%00", "x" * 300, "sess%0d%0aSet-Cookie:%20a=b"):
        status, out = _raw(port, _req(f"/s/{sid}{route}", b"{}"))
        assert status in (400, 404), (sid, status)
    status, out = _raw(port, _req(route, b"{}", extra="X-Orchard-Session: a\tb\r\n"))
    assert status == 400


def _spec_fixture():  # type: ignore[no-untyped-def]
    from orchard_rec.proxy.openapi import openapi_spec

    return schemathesis.openapi.from_dict(openapi_spec())


schema = schemathesis.pytest.from_fixture("openapi_schema")


@pytest.fixture
def openapi_schema():  # type: ignore[no-untyped-def]
    return _spec_fixture()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_against_the_proxys_openapi(case, token_proxy) -> None:  # type: ignore[no-untyped-def]
    response = case.call(base_url=token_proxy.url, timeout=20)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
