"""``orchard-rec intercept --mode tito`` and the intercept's default durability.

The mitmproxy door drives the same sans-io core as ``serve`` for tito (``proxy.titocall``): the
records are the server's exact ids, one sample per session, the same as ``serve --mode tito``
records for the same sessions. And by default (``--durability process``) a call whose client had
its answer is in the spool: a ``kill -9`` of the mitmproxy process right after loses nothing.
"""

from __future__ import annotations

import openai
import pytest
from e2e.agents import AGENTS
from factories import check_invariants, session_base

from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome
from orchard_rec.storage import Store

pytestmark = [pytest.mark.slow, pytest.mark.network]  # mitmproxy runtimes in subprocesses

BASES = {
    "chat": "https://api.openai.com/v1",
    "responses": "https://api.openai.com/v1",
    "messages": "https://api.anthropic.com",
}


def _prompts(log: list[tuple[str, dict]]) -> list[list[int]]:  # type: ignore[type-arg]
    return [body["prompt"] for _path, body in log]


def test_tito_mode_records_exact_ids_one_sample_per_session(
    upstream_factory, intercept_factory, proxy_factory, via, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Real SDK sessions hard-coded to the real API hosts, through intercept in tito mode to a
    server that would re-tokenize text non-canonically (drift): each session is one exact sample,
    every prompt is the ids the server ran, and the records equal ``serve --mode tito``'s."""
    up = upstream_factory(drift=True)
    db = f"sqlite:///{tmp_path / 'tito.db'}"
    it = intercept_factory(db, "--upstream-override", up.url, "--mode", "tito", "--tokenizer", "demo")
    via(it)
    sent: dict[str, list[list[int]]] = {}
    for dialect, agent in AGENTS.items():
        before = len(up.fake.log)
        n = agent(BASES[dialect], None, {"X-Orchard-Session": f"tito-{dialect}"})
        sent[dialect] = _prompts(up.fake.log[before:])
        assert len(sent[dialect]) == n and all(p.endswith("/completions") for p, _ in up.fake.log[before:])
    assert it.stop() == 0
    proxy = proxy_factory(up.url, f"sqlite:///{tmp_path / 'serve.db'}", mode="tito", tokenizer="demo")
    for dialect, agent in AGENTS.items():
        agent(session_base(proxy.url, f"tito-{dialect}", dialect), None)
    proxy.flush()
    store, served = Store(db), proxy.store()
    for dialect in AGENTS:
        sid = f"tito-{dialect}"
        calls = store.calls(sid)
        assert len(calls) == len(sent[dialect]) >= 2
        assert all(c.outcome is CallOutcome.OK and c.completion_ids for c in calls)
        assert [list(c.prompt_ids) for c in calls] == sent[dialect]  # exact: what the server ran
        assert [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * (len(calls) - 1)
        assert {c.metadata["intercept"]["host"] for c in calls} == {BASES[dialect].split("/")[2]}
        [sample] = reconstruct_session(calls)
        assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
        check_invariants(calls, [sample])
        theirs = served.calls(sid)  # the same records as the aiohttp door's
        assert [(list(c.prompt_ids), list(c.completion_ids)) for c in calls] == [
            (list(c.prompt_ids), list(c.completion_ids)) for c in theirs
        ]
        assert [c.response for c in calls] != [None] * len(calls)
        assert [c.stream for c in calls] == [c.stream for c in theirs]


def test_tito_mode_without_a_tokenizer_is_a_usage_error(intercept_cmd, upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    r = subprocess.run(
        [*intercept_cmd, "intercept", "--listen", "127.0.0.1:0", "--db", f"sqlite:///{tmp_path / 'u.db'}"]
        + ["--upstream-override", upstream.url, "--mode", "tito"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--tokenizer" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("mode", ["token", "tito"])
def test_an_answered_call_survives_kill_9_by_default(
    upstream, intercept_factory, via, tmp_path, mode
) -> None:  # type: ignore[no-untyped-def]
    """Default durability: the client has its answer only once its call's spool line is written,
    so a ``kill -9`` of the mitmproxy process right after the answer loses nothing: the next start
    replays the spool into the database. A whole answer and an event stream."""
    db = f"sqlite:///{tmp_path / 'k.db'}"
    spool = str(tmp_path / "k.spool")
    args = ["--upstream-override", upstream.url, "--spool", spool, "--mode", mode]
    if mode == "tito":
        args += ["--tokenizer", "demo"]
    it = intercept_factory(db, *args)
    via(it)
    client = openai.OpenAI(api_key="sk-x", max_retries=0, default_headers={"X-Orchard-Session": "kill"})
    msgs = [{"role": "user", "content": "hello there"}]
    whole = client.chat.completions.create(model="m", messages=msgs)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m",
            messages=[*msgs, {"role": "assistant", "content": whole.choices[0].message.content}]
            + [{"role": "user", "content": "and again"}],
            stream=True,
        )
        if c.choices
    )
    it.proc.kill()  # SIGKILL: no drain, no shutdown hook
    it.proc.wait(30)
    assert it.proc.returncode == -9
    again = intercept_factory(db, *args)  # replays the spool at start
    assert again.stop() == 0
    calls = Store(db).calls("kill")
    assert [c.outcome for c in calls] == [CallOutcome.OK, CallOutcome.OK]
    assert [c.stream for c in calls] == [False, True]
    assert calls[0].response["choices"][0]["message"]["content"] == whole.choices[0].message.content
    assert all(c.completion_ids for c in calls) and text
