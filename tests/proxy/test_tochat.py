"""Token mode's translation reused across a session's calls (``proxy.tochat``): always
``dialects.to_chat``'s result and errors, over sequences of Responses and Messages calls whose
items are shared objects (as ``proxy.reqparse`` hands them out): appends, edits, retries,
changed instructions, invalid and untranslatable items; earlier calls' results stay unchanged."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec import dialects
from orchard_rec.errors import OrchardError
from orchard_rec.proxy.reqparse import RequestCache
from orchard_rec.proxy.tochat import Translator
from orchard_rec.records import Dialect
from tests.dialects.strategies import SETTINGS

texts = st.text(max_size=12)
resp_items = st.one_of(
    st.builds(
        lambda r, c: {"type": "message", "role": r, "content": c},
        st.sampled_from(["user", "assistant", "developer", "system"]),
        st.one_of(
            texts,
            st.lists(
                st.builds(
                    lambda t, x: {"type": t, "text": x},
                    st.sampled_from(["input_text", "output_text", "refusal"]),
                    texts,
                ),
                max_size=2,
            ),
        ),
    ),
    st.builds(lambda t: {"type": "reasoning", "summary": [{"type": "summary_text", "text": t}]}, texts),
    st.builds(
        lambda i, a: {"type": "function_call", "call_id": i, "name": "f", "arguments": a}, texts, texts
    ),
    st.builds(lambda i: {"type": "custom_tool_call", "call_id": i, "name": "g", "input": "x"}, texts),
    st.builds(lambda i, o: {"type": "function_call_output", "call_id": i, "output": o}, texts, texts),
    st.builds(lambda r: {"role": r, "content": "no type"}, st.sampled_from(["user", "assistant"])),
    st.sampled_from(
        [{"type": "item_reference", "id": "x"}, 3, {"type": "function_call", "name": 5, "arguments": 7}]
    ),
)
blocks = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda t: {"type": "thinking", "thinking": t}, texts),
    st.builds(lambda i: {"type": "tool_use", "id": i, "name": "Bash", "input": {"command": i}}, texts),
    st.builds(
        lambda i, c: {"type": "tool_result", "tool_use_id": i, "content": c},
        texts,
        st.one_of(texts, st.just([{"type": "text", "text": "r"}])),
    ),
    st.just({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}),
    st.just({"type": "tool_result", "tool_use_id": "t", "content": 5}),
)
msg_items = st.one_of(
    st.builds(
        lambda r, c: {"role": r, "content": c},
        st.sampled_from(["user", "assistant"]),
        st.one_of(texts, st.lists(blocks, max_size=3)),
    ),
    st.just({"role": "system", "content": "sys"}),
    st.just({"role": "robot", "content": "invalid role"}),
    st.just({"role": "user", "content": 5}),  # untranslatable: not iterable
)
ops = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3)),
    st.tuples(st.just("retry"), st.none()),
    st.tuples(st.just("edit"), st.integers(0, 30)),
    st.tuples(st.just("truncate"), st.integers(0, 30)),
    st.tuples(st.just("instructions"), texts),
)


def _translate(f: Any) -> Any:
    try:
        out = f()
    except OrchardError as exc:
        return (type(exc), exc.message, exc.param), None
    return orjson.dumps(out), out


@pytest.mark.slow  # 120 random conversations: 1-2 s (the two examples below stay fast)
@settings(SETTINGS, max_examples=120)
@given(dialect=st.sampled_from([Dialect.RESPONSES, Dialect.MESSAGES]), data=st.data())
def test_reused_translation_is_to_chat(dialect: Dialect, data: Any) -> None:
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    tr = Translator(1 << 24)
    key = "input" if dialect is Dialect.RESPONSES else "messages"
    items = resp_items if dialect is Dialect.RESPONSES else msg_items
    convo: list[Any] = []
    top: dict[str, Any] = {"model": "m", "max_tokens": 5, "instructions": "be brief", "system": "s"}
    results: list[tuple[dict[str, Any], bytes]] = []
    for op, arg in data.draw(st.lists(ops, min_size=1, max_size=10)):
        if op == "append":
            convo = convo + data.draw(st.lists(items, min_size=arg, max_size=arg))
        elif op == "edit" and convo:
            convo = list(convo)
            convo[arg % len(convo)] = data.draw(items)
        elif op == "truncate":
            convo = convo[: arg % (len(convo) + 1)]
        elif op == "instructions":
            top = {**top, "instructions": arg}
        raw = orjson.dumps({**top, key: convo, "stream": False})
        body = cache.parse(raw, "s").obj  # items shared with the previous call's, as the proxy has them
        want, _ = _translate(lambda b=body: dialects.to_chat(dialect, b))
        got, chat = _translate(lambda b=body, n=len(raw): tr.to_chat(dialect, b, "s", n))
        assert got == want
        if chat is not None:
            results.append((chat, got))
            again = tr.to_chat(dialect, body, "s", len(raw))  # a retry: the same again
            assert orjson.dumps(again) == want
            results.append((again, want))
    for chat, was in results:  # nothing translated later changed an earlier call's chat body
        assert orjson.dumps(chat) == was


def test_reuse_happens_and_state_is_bounded() -> None:
    tr = Translator(10_000)
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    convo: list[Any] = []
    for turn in range(5):
        convo = [*convo, {"role": "user", "content": f"u{turn}"}, {"role": "assistant", "content": "a"}]
        raw = orjson.dumps({"model": "m", "max_tokens": 5, "messages": convo})
        body = cache.parse(raw, "s").obj
        assert tr.to_chat(Dialect.MESSAGES, body, "s", len(raw)) == dialects.to_chat(Dialect.MESSAGES, body)
    assert tr.reused == 2 + 4 + 6 + 8
    for i in range(20):
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        tr.to_chat(Dialect.MESSAGES, body, f"s{i}", 1000)
        assert tr.size <= 10_000


def test_sub_agents_in_one_session_keep_their_own_translations() -> None:
    """Claude Code runs sub-agents under its session id: the main conversation and a sub-agent's
    alternate, and each continues its own translation."""
    tr = Translator(1 << 24)
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    convos = {"main": [{"role": "user", "content": "task"}], "sub": [{"role": "user", "content": "sub-task"}]}
    for turn in range(4):
        for name, convo in convos.items():
            convo += [{"role": "assistant", "content": f"{name}{turn}"}, {"role": "user", "content": "ok"}]
            raw = orjson.dumps({"model": "m", "max_tokens": 5, "system": name, "messages": convo})
            body = cache.parse(raw, "s").obj
            before = tr.reused
            assert tr.to_chat(Dialect.MESSAGES, body, "s", len(raw)) == dialects.to_chat(
                Dialect.MESSAGES, body
            )
            if turn:
                assert tr.reused - before == len(convo) - 2
