"""Regression tests for issue 17's faults, against the demo upstream (the real vLLM checks
are in tests/vllm/)."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from typing import Any

import orjson

from orchard_rec.protocol.assemble import assemble
from orchard_rec.records import Dialect


def _post(url: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=raw, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


BODIES = {
    "chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "responses": {"model": "m", "input": "hi"},
    "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
}


def test_bad_gzip_body_is_a_400_in_the_dialect(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Bug 8: ``Content-Encoding: gzip`` over a body that is not gzip was a 500 on all four endpoints."""
    proxy = proxy_factory(upstream.url, sqlite_url)
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    for path in BODIES:
        _check_gzip(proxy.url, path, headers)


def _check_gzip(url: str, path: str, headers: dict[str, str]) -> None:
    raw = orjson.dumps(BODIES[path])
    status, body = _post(f"{url}/v1/{path}", raw, headers)
    assert status == 400, body
    if path == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"
    # a real gzip body still works
    status, body = _post(f"{url}/v1/{path}", gzip.compress(raw), headers)
    assert status == 200, body


def test_streamed_chat_keeps_the_last_chunks_system_fingerprint() -> None:
    """Bug 9: vLLM sends ``system_fingerprint`` in the last chunk only."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [
        (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, {**base, "system_fingerprint": "fp_vllm", "choices": [], "usage": {"prompt_tokens": 1}}),
    ]
    assert assemble(Dialect.CHAT, events)["system_fingerprint"] == "fp_vllm"
