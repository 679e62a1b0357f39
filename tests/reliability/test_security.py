"""Proxy authentication, admin routes, upstream credentials, and no secret stored or logged."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import anthropic
import openai
import pytest
from aiohttp import web
from sqlalchemy import create_engine, text

from orchard_rec.proxy.server import BackgroundServer

CLIENT_KEY = "sk-client-9f8e7d6c5b4a"
BOUND_KEY = "sk-team-a-1234567890"
ADMIN_KEY = "sk-admin-0a1b2c3d4e5f"
UPSTREAM_KEY = "sk-upstream-secret-777"


@pytest.fixture
def key_upstream(upstream):  # type: ignore[no-untyped-def]
    """The demo upstream behind a check of the upstream key (as a commercial API would)."""
    seen: list[dict[str, str]] = []

    @web.middleware
    async def check(request: web.Request, handler):  # type: ignore[no-untyped-def]
        seen.append(dict(request.headers))
        if request.headers.get("Authorization") != f"Bearer {UPSTREAM_KEY}":
            return web.json_response({"error": {"message": "bad upstream key"}}, status=401)
        return await handler(request)

    app = upstream.fake.app()
    app.middlewares.append(check)
    srv = BackgroundServer(app).start()
    yield srv.url + "/v1", seen
    srv.stop()


def _post(url: str, body: dict, headers: dict) -> tuple[int, dict]:  # type: ignore[type-arg]
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_keys_sessions_admin_and_secrets(key_upstream, served_factory, workers, db_url, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    url, seen = key_upstream
    proxy = served_factory(
        url,
        db_url,
        mode="token",
        api_keys=(CLIENT_KEY, f"{BOUND_KEY}:team-a-"),
        admin_keys=(ADMIN_KEY,),
        upstream_key=UPSTREAM_KEY,
        **({"log_level": "debug"} if workers > 1 else {}),  # served: its own log, on stderr
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    status, body = _post(f"{proxy.url}/v1/chat/completions", chat, {})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, body = _post(
        f"{proxy.url}/v1/messages",
        {"model": "m", "max_tokens": 5, "messages": []},
        {"x-api-key": "wrong", "anthropic-version": "2023-06-01"},
    )
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"

    ok = openai.OpenAI(base_url=f"{proxy.url}/s/run-1/v1", api_key=CLIENT_KEY, max_retries=0)
    assert (
        ok.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        .choices[0]
        .message.content
    )
    ant = anthropic.Anthropic(base_url=f"{proxy.url}/s/team-a-7", api_key=BOUND_KEY, max_retries=0)
    assert ant.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}]).content
    with pytest.raises(openai.PermissionDeniedError):  # a key bound to team-a- cannot record elsewhere
        openai.OpenAI(
            base_url=f"{proxy.url}/s/team-b-1/v1", api_key=BOUND_KEY, max_retries=0
        ).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    # the upstream saw only the proxy's own key, never a client's
    assert all(h.get("Authorization") == f"Bearer {UPSTREAM_KEY}" for h in seen)
    assert not any(CLIENT_KEY in json.dumps(h) or BOUND_KEY in json.dumps(h) for h in seen)

    # admin routes need the admin key
    assert (
        _post(
            f"{proxy.url}/sessions/run-1/outcome", {"reward": 1}, {"Authorization": f"Bearer {CLIENT_KEY}"}
        )[0]
        == 401
    )
    assert (
        _post(
            f"{proxy.url}/sessions/run-1/outcome",
            {"reward": 1, "create": True},
            {"Authorization": f"Bearer {ADMIN_KEY}"},
        )[0]
        == 200
    )

    proxy.flush()
    eng = create_engine(db_url)
    with eng.connect() as conn:
        dump = ""
        for table in ("calls", "sessions"):
            for row in conn.execute(text(f"SELECT * FROM {table}")):
                dump += repr(tuple(row))
    eng.dispose()
    logs = caplog.text if workers == 1 else proxy.log.read_text()
    assert workers == 1 or "orchard-rec proxy" in logs  # the served log was read
    for secret in (CLIENT_KEY, BOUND_KEY, ADMIN_KEY, UPSTREAM_KEY):
        assert secret not in dump, "a secret reached the database"
        assert secret not in logs, "a secret reached the logs"
    assert "run-1" in dump and "team-a-7" in dump
