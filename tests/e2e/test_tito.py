"""Token-in/token-out mode: the proxy renders prompts and sends ids, so sessions never drift.

Against the upstream in drift mode (which would re-tokenize text non-canonically), real SDK
sessions (openai chat and responses, anthropic messages), stream and not, with tools:
every linear session is exactly one sample, the invariants hold, and the prompts the
upstream received (its own log) extend each other exactly, turn after turn."""

from __future__ import annotations

import itertools

import pytest
from factories import session_base

from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome

from .agents import AGENTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
]  # tito sessions with a Hugging Face tokenizer: 2-7 s each


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_sessions_are_exact_and_prompts_prefix_consistent(
    upstream_factory, proxy_factory, sqlite_url, dialect, kind
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(drift=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo", upstream_kind=kind)
    for k, stream in enumerate([None, True, False]):
        sid = f"{dialect}-{k}"
        before = len(up.fake.log)
        n = AGENTS[dialect](session_base(proxy.url, sid, dialect), stream)
        sent = [b["prompt"] if "prompt" in b else b["input_ids"] for _, b in up.fake.log[before:]]
        assert len(sent) == n
        proxy.flush()
        calls = proxy.store().calls(sid)
        assert len(calls) == n and all(c.outcome is CallOutcome.OK for c in calls)
        for a, b, prompt_b in zip(
            calls, calls[1:], sent[1:]
        ):  # the upstream's own log: each prompt extends the last
            assert prompt_b[: len(a.prompt_ids) + len(a.completion_ids)] == list(a.prompt_ids) + list(
                a.completion_ids
            )
            assert list(b.prompt_ids) == prompt_b
        assert [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * (n - 1)
        [sample] = reconstruct_session(calls)  # one exact sample, drift or not
        assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
        for c in calls:
            [t] = [t for t in sample.turns if t.call_id == c.call_id]
            assert sample.response_ids[t.start : t.end] == list(c.completion_ids)
            assert sample.loss_mask[t.start : t.end] == [1] * len(c.completion_ids)


def test_an_edited_history_starts_a_new_branch(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    import openai

    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/edit/v1", api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]
    a1 = client.chat.completions.create(model="m", messages=msgs).choices[0].message.content
    client.chat.completions.create(
        model="m", messages=msgs + [{"role": "assistant", "content": a1}, {"role": "user", "content": "more"}]
    )
    # a compacted history: the first exchange summarised away
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "S"},
            {"role": "user", "content": "summary: said hello. more"},
        ],
    )
    proxy.flush()
    calls = proxy.store().calls("edit")
    decisions = [c.metadata["tito"] for c in calls]
    assert [d["fresh"] for d in decisions] == [True, False, True]
    assert decisions[0]["branch"] == decisions[1]["branch"] != decisions[2]["branch"]
    samples = reconstruct_session(calls)
    assert len(samples) == 2  # one sample per branch, never a silently wrong prefix


def test_a_turn_cut_at_max_tokens_is_continued_with_its_exact_ids(
    upstream, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    """A turn cut at ``max_tokens`` (finish ``length``) stays in the branch: the next prompt is its
    exact prompt + generated ids, then the template's closing and new tokens, so the session is
    still one sample (it used to fall back to the branch before the cut turn and re-encode it)."""
    import openai

    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/cut/v1", api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]
    r1 = client.chat.completions.create(model="m", messages=msgs, max_tokens=3)
    assert r1.choices[0].finish_reason == "length"
    msgs += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "go on"},
    ]
    client.chat.completions.create(model="m", messages=msgs)
    proxy.flush()
    a, b = proxy.store().calls("cut")
    assert a.finish_reason == "length" and len(a.completion_ids) == 3
    assert b.metadata["tito"]["fresh"] is False
    head = list(a.prompt_ids) + list(a.completion_ids)
    assert list(b.prompt_ids)[: len(head)] == head
    [sample] = reconstruct_session([a, b])
    assert sample.tokens == list(b.prompt_ids) + list(b.completion_ids)


def test_a_long_session_is_exact_with_the_prompt_echo_cut(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Past 16 kB the server's echo of the prompt (``prompt_token_ids``) is cut out of its answer
    rather than parsed on the event loop, and calls render only what is new (``TitoSessions``):
    every prompt still extends the last with the exact ids, and the records hold what was sent."""
    import openai

    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/long/v1", api_key="x", max_retries=0)
    msgs: list[dict] = [{"role": "system", "content": "S"}]  # type: ignore[type-arg]
    for t in range(8):
        msgs.append(
            {"role": "user", "content": f"step {t}: " + " ".join(f"word{k % 97}" for k in range(1500))}
        )
        r = client.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    proxy.flush()
    calls = proxy.store().calls("long")
    assert len(calls) == 8 and [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * 7
    assert len(calls[-1].prompt_ids) > 16_000
    for a, b in itertools.pairwise(calls):
        head = list(a.prompt_ids) + list(a.completion_ids)
        assert list(b.prompt_ids)[: len(head)] == head
    sent = [b["prompt"] for _, b in upstream.fake.log[-8:]]
    assert [list(c.prompt_ids) for c in calls] == sent
    [sample] = reconstruct_session(calls)
    assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)


def test_sessions_past_the_byte_bound_are_rebuilt_from_the_database(
    upstream, proxy_factory, sqlite_url, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Branch state is bounded in bytes (``ORCHARD_TITO_CACHE_MB``): two sessions taking turns
    through a bound that holds one drop each other every call, and each next call rebuilds its
    session from the database, so both continue their branch with the exact ids."""
    import openai

    from orchard_rec.proxy.app import TITO

    monkeypatch.setenv("ORCHARD_TITO_CACHE_MB", "0.01")  # 10 kB: less than one session's branch
    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    tito = proxy.server.app[TITO]
    assert tito.max_bytes == int(0.01 * (1 << 20))
    convs = {sid: [{"role": "system", "content": f"You are agent {sid}."}] for sid in ("ev-a", "ev-b")}
    for t in range(4):
        for sid, msgs in convs.items():
            client = openai.OpenAI(base_url=f"{proxy.url}/s/{sid}/v1", api_key="x", max_retries=0)
            msgs.append({"role": "user", "content": f"step {t} of {sid}: " + "word " * 400})
            r = client.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            assert len(tito._sessions) == 1 and tito.bytes > tito.max_bytes  # only the last one kept
    proxy.flush()
    for sid in convs:
        calls = proxy.store().calls(sid)
        assert [c.metadata["tito"]["fresh"] for c in calls] == [True, False, False, False]
        for a, b in itertools.pairwise(calls):
            head = list(a.prompt_ids) + list(a.completion_ids)
            assert list(b.prompt_ids)[: len(head)] == head
        [sample] = reconstruct_session(calls)
        assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
