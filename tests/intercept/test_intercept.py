"""``orchard-rec intercept``: mitmproxy in front of harnesses that hard-code their API host.

The clients are the real openai and anthropic SDKs configured only through the environment
(``HTTPS_PROXY`` and ``SSL_CERT_FILE`` = mitmproxy's CA), as a harness that cannot be
pointed at a base URL would be.
"""

from __future__ import annotations

import json
import ssl
import urllib.request

import anthropic
import openai
import pytest
from e2e.agents import AGENTS
from factories import check_invariants

from orchard_rec.pipeline import iter_samples
from orchard_rec.records import CallOutcome, Dialect
from orchard_rec.storage import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
]  # mitmproxy runtimes in subprocesses, real SDKs through them

SID = {"chat": "icpt-chat", "responses": "icpt-resp", "messages": "icpt-msg"}


def _suffix(dialect: str) -> str:
    return "" if dialect == "messages" else "/v1"


def test_print_ca_gives_the_ca_and_the_env_a_harness_needs(intercept_cmd, mitm_confdir) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    out = subprocess.run(
        [
            *intercept_cmd,
            "intercept",
            "--print-ca",
            "--confdir",
            str(mitm_confdir),
            "--listen",
            "127.0.0.1:8085",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    env = dict(
        line[len("export ") :].split("=", 1) for line in out.splitlines() if line.startswith("export ")
    )
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:8085"
    assert env["NODE_EXTRA_CA_CERTS"] == str(mitm_confdir / "mitmproxy-ca-cert.pem")
    bundle = open(env["SSL_CERT_FILE"]).read()
    assert env["REQUESTS_CA_BUNDLE"] == env["SSL_CERT_FILE"]
    assert open(env["NODE_EXTRA_CA_CERTS"]).read().strip() in bundle  # the system's CAs plus mitmproxy's
    assert bundle.count("BEGIN CERTIFICATE") > 1


@pytest.mark.parametrize("stream", [False, True])
def test_client_gets_the_upstreams_bytes_and_the_call_is_recorded(
    tls_upstream, intercept_factory, via, test_ca_file, tmp_path, stream
) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'i.db'}"
    it = intercept_factory(db, "--hosts", "localhost", "--upstream-ca", str(test_ca_file))
    via(it)
    client = openai.OpenAI(
        base_url=tls_upstream.url,
        api_key="sk-secret-key",
        max_retries=0,
        default_headers={"X-Orchard-Session": "raw"},
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "run `ls`"}], "tools": [AGENTS_TOOL]}
    if stream:
        with client.chat.completions.with_streaming_response.create(**body, stream=True) as r:  # type: ignore[call-overload]
            got = b"".join(r.iter_bytes())
            ctype = r.headers["content-type"]
    else:
        r = client.chat.completions.with_raw_response.create(**body)  # type: ignore[call-overload]
        got = r.http_response.read()
        ctype = r.headers["content-type"]
    # unchanged: the bytes the upstream sent, in one piece or as the same event stream
    assert got == tls_upstream.fake.sent[-1]
    assert ctype.startswith("text/event-stream" if stream else "application/json")
    sent_up = tls_upstream.fake.log[-1][1]
    assert "return_token_ids" not in sent_up  # nothing injected towards the real API
    # a non-LLM path on the same host passes through and is not recorded
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": it.url}),
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(it.ca_cert))),
    )
    health = opener.open(tls_upstream.url[: -len("/v1")] + "/health", timeout=30)
    assert health.status == 200
    assert it.stop() == 0
    [rec] = Store(db).calls("raw")
    assert (
        rec.dialect is Dialect.CHAT
        and rec.outcome is CallOutcome.OK
        and rec.status_code == 200
        and rec.stream is stream
    )
    assert rec.request == body | ({} if not stream else {"stream": True})
    assert rec.metadata["intercept"]["host"] == "localhost"
    assert rec.harness == "openai-python"
    assert "sk-secret-key" not in json.dumps(rec.headers) and "authorization" not in rec.headers
    assert "x-orchard-session" not in {
        k.lower() for k in tls_upstream.fake.headers[-1]
    }  # ours, not the upstream's
    assert (
        tls_upstream.fake.headers[-1]["authorization"] == "Bearer sk-secret-key"
    )  # the client's key reaches its API
    assert rec.response["choices"][0]["message"]["tool_calls"]
    assert rec.bytes_out == len(got)


AGENTS_TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


def test_agents_through_intercept_reconstruct_like_proxy_mode(
    tls_upstream, upstream, intercept_factory, proxy_factory, via, test_ca_file, tmp_path, hf_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    """Multi-turn tool sessions over chat, Responses and Messages, stream and not, to a real
    HTTPS host: the same samples as the same sessions recorded by the base-URL proxy."""
    idb = f"sqlite:///{tmp_path / 'intercept.db'}"
    it = intercept_factory(idb, "--hosts", "localhost", "--upstream-ca", str(test_ca_file))
    proxy = proxy_factory(upstream.url, f"sqlite:///{tmp_path / 'proxy.db'}", mode="passthrough")
    for dialect, agent in AGENTS.items():
        agent(f"{proxy.url}/s/{SID[dialect]}{_suffix(dialect)}", None)
    proxy.flush()
    via(it)
    counts = {
        d: agent(tls_upstream.url[: -len("/v1")] + _suffix(d), None, {"X-Orchard-Session": SID[d]})
        for d, agent in AGENTS.items()
    }
    assert it.stop() == 0
    istore, pstore = Store(idb), proxy.store()
    for dialect, sid in SID.items():
        calls = istore.calls(sid)
        assert len(calls) == counts[dialect] and all(c.outcome is CallOutcome.OK for c in calls)
        assert {c.stream for c in calls} == {True, False}
        assert [c.seq for c in calls] == list(range(1, len(calls) + 1))
        assert {c.dialect.value for c in calls} == {dialect}
        pcalls = pstore.calls(sid)
        for a, b in zip(calls, pcalls):  # the same fields filled as a proxy-mode record
            assert (a.response is None, a.events is None, a.usage is None) == (
                b.response is None,
                b.events is None,
                b.usage is None,
            )
        mine = list(iter_samples(istore, sessions=[sid], tokenizer=hf_tokenizer))
        theirs = list(iter_samples(pstore, sessions=[sid], tokenizer=hf_tokenizer))
        assert len(mine) == 1 and mine[0].metadata["token_source"] == "retokenized"
        assert [s.tokens for s in mine] == [s.tokens for s in theirs]
        assert [s.loss_mask for s in mine] == [s.loss_mask for s in theirs]


def test_upstream_override_gives_token_exact_samples(upstream, intercept_factory, via, db_url) -> None:  # type: ignore[no-untyped-def]
    """A harness hard-coded to api.openai.com / api.anthropic.com runs on the local vLLM-style
    server instead; token mode injects and hides ids, so the samples are the server's exact tokens.
    On SQLite and on PostgreSQL (the intercept process writes with its own psycopg)."""
    db = db_url
    it = intercept_factory(db, "--upstream-override", upstream.url)
    via(it)
    bases = {
        "chat": "https://api.openai.com/v1",
        "responses": "https://api.openai.com/v1",
        "messages": "https://api.anthropic.com",
    }
    counts = {
        d: agent(bases[d], None, {"X-Orchard-Session": SID[d]}) for d, agent in AGENTS.items()
    }  # agents assert no injected field reached them
    assert len(upstream.fake.sent) == sum(counts.values())
    assert all(body.get("return_token_ids") is True for _path, body in upstream.fake.log)
    assert it.stop() == 0
    store = Store(db)
    ordered = sorted((c for sid in SID.values() for c in store.calls(sid)), key=lambda c: c.received_at)
    sent = {c.call_id: data for c, data in zip(ordered, upstream.fake.sent)}
    for dialect, sid in SID.items():
        calls = store.calls(sid)
        assert len(calls) == counts[dialect]
        assert all(
            c.outcome is CallOutcome.OK and c.prompt_ids and c.completion_ids and c.completion_logprobs
            for c in calls
        )
        assert {c.metadata["intercept"]["host"] for c in calls} == {
            "api.anthropic.com" if dialect == "messages" else "api.openai.com"
        }
        samples = list(iter_samples(store, sessions=[sid]))
        assert len(samples) == 1 and samples[0].metadata["token_source"] == "server"
        check_invariants(calls, samples)
        # token-exact: every generation is the server's own ids, as it sent them
        assert [list(c.completion_ids) for c in calls] == [server_ids(sent[c.call_id]) for c in calls]


def server_ids(data: bytes) -> list[int]:
    """The completion token ids in a vLLM chat answer as sent: one JSON object, or SSE chunks."""
    if not data.startswith(b"data: "):
        return json.loads(data)["choices"][0]["token_ids"]
    ids: list[int] = []
    for frame in data.decode().split("\n\n"):
        if frame.startswith("data: {"):
            for c in json.loads(frame[6:]).get("choices") or ():
                ids += c.get("token_ids") or []
    return ids


def test_malformed_body_gets_an_error_in_the_clients_dialect(
    upstream, intercept_factory, via, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'e.db'}"
    it = intercept_factory(db, "--upstream-override", upstream.url)
    via(it)
    client = anthropic.Anthropic(
        api_key="sk-ant-x", max_retries=0, default_headers={"X-Orchard-Session": "bad"}
    )
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.post(
            "/v1/messages",
            body={"model": "m", "max_tokens": 5, "messages": [], "stream": "yes"},
            cast_to=object,
        )
    assert exc.value.body["type"] == "error" and "stream" in exc.value.body["error"]["message"]  # type: ignore[index]
    oclient = openai.OpenAI(api_key="sk-x", max_retries=0, default_headers={"X-Orchard-Session": "bad"})
    with pytest.raises(openai.BadRequestError) as oexc:
        oclient.post("/chat/completions", body=["not", "an", "object"], cast_to=object)
    assert "JSON object" in oexc.value.body["message"]  # type: ignore[index]
    assert it.stop() == 0
    calls = Store(db).calls("bad")
    assert [c.outcome for c in calls] == [CallOutcome.REJECTED, CallOutcome.REJECTED]
    assert len(upstream.fake.log) == 0


def test_other_hosts_are_tunnelled_untouched(
    tls_upstream, intercept_factory, monkeypatch, test_ca_file, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """A host not in --hosts is not decrypted: the client sees the server's own certificate
    (it trusts only the test CA here, not mitmproxy's) and nothing is recorded."""
    db = f"sqlite:///{tmp_path / 't.db'}"
    it = intercept_factory(db, "--hosts", "api.openai.com")
    monkeypatch.setenv("HTTPS_PROXY", it.url)
    monkeypatch.setenv("SSL_CERT_FILE", str(test_ca_file))
    client = openai.OpenAI(
        base_url=tls_upstream.url,
        api_key="sk-x",
        max_retries=0,
        default_headers={"X-Orchard-Session": "tunnel"},
    )
    r = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert r.http_response.read() == tls_upstream.fake.sent[-1]
    assert tls_upstream.fake.headers[-1]["x-orchard-session"] == "tunnel"  # bytes untouched, our header too
    assert it.stop() == 0
    assert Store(db).sessions() == []


def test_client_gone_mid_stream_is_recorded_as_aborted(
    upstream_factory, intercept_factory, via, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    slow = upstream_factory(chunk_delay=0.05)
    db = f"sqlite:///{tmp_path / 'a.db'}"
    it = intercept_factory(db, "--upstream-override", slow.url)
    via(it)
    client = openai.OpenAI(api_key="sk-x", max_retries=0, default_headers={"X-Orchard-Session": "gone"})
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "run `ls` and tell me a long story"}], stream=True
    )
    for _ in zip(range(3), stream):
        pass
    stream.close()
    assert it.stop() == 0
    [rec] = Store(db).calls("gone")
    assert rec.outcome is CallOutcome.ABORTED and rec.error
    assert rec.completion_ids  # what had been generated before the client left is kept


@pytest.mark.parametrize("harness_name", ["codex", "claude-code"])
def test_real_harness_with_its_hard_coded_api_host(
    harness_name, upstream, intercept_factory, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Codex and Claude Code with no base URL set at all (they call https://api.openai.com and
    https://api.anthropic.com), only HTTPS_PROXY and the CA: they finish their tool task on the
    local server and every call lands in one session, one exact sample."""
    import subprocess

    from orchard_rec.harnesses import CLAUDE_CODE, CODEX, install
    from orchard_rec.harnesses.base import _base_env
    from orchard_rec.reconstruct import reconstruct_session

    harness = CODEX if harness_name == "codex" else CLAUDE_CODE
    install(harness)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    it = intercept_factory(db, "--upstream-override", upstream.url)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    launch = harness.prepare(
        home,
        work,
        "http://unused",
        "unused",
        "fake-model",
        ["Please run `echo orchard > marker.txt` and tell me when it is done."],
        None,
    )
    env = {
        **_base_env(home),
        **launch.env,
        "HTTPS_PROXY": it.url,
        "SSL_CERT_FILE": str(it.confdir / "orchard-ca-bundle.pem"),
        "NODE_EXTRA_CA_CERTS": str(it.ca_cert),
    }
    if harness is CODEX:  # the built-in OpenAI provider, not the custom one prepare() configures
        cfg = home / "codex-home" / "config.toml"  # the same settings, less the provider section
        cfg.write_text(
            cfg.read_text().split("[model_providers.orchard]")[0].replace('model_provider = "orchard"\n', "")
        )
        env.update(OPENAI_API_KEY="sk-test")
    else:
        env.pop("ANTHROPIC_BASE_URL")
    r = subprocess.run(
        launch.argv, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (work / "marker.txt").read_text().strip() == "orchard"
    assert it.stop() == 0
    store = Store(db)
    [session] = store.sessions()
    calls = store.calls(session.id)
    assert len(calls) >= 2 and all(c.outcome is CallOutcome.OK and c.harness == harness.name for c in calls)
    host = "api.openai.com" if harness is CODEX else "api.anthropic.com"
    assert {c.metadata["intercept"]["host"] for c in calls} == {host}
    samples = reconstruct_session(calls, on_mismatch=harness.on_mismatch)
    assert len(samples) == 1
    check_invariants(calls, samples)
