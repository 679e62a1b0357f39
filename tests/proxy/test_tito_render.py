"""Tito's small renderings: a session's call renders its new messages, not the whole conversation.

The oracle is the chat template itself: every prompt, decoded, must be the template's rendering of
the request (``apply_chat_template``), whether the call was planned from a small rendering or not.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import orjson
import pytest

from orchard_rec.proxy import tito as tito_mod
from orchard_rec.proxy.tito import TitoSessions, chat_images
from orchard_rec.proxy.tito_wire import parse_generation
from orchard_rec.storage.delta import Ids
from orchard_rec.tokenizer import load_hf_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]

NUMBERED = (
    "{%- for m in messages -%}[{{ loop.index }}] {{ m.role }}: {{ m.content or '' }}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}[{{ messages | length + 1 }}] {{ 'assistant: ' }}{%- endif -%}"
)
"""Numbers its messages: a message's rendering depends on how many come before it."""

DROPS_OLD_REASONING = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}{{ '\\n' }}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last and m.content and '</think>' in m.content -%}"
    "{{ m.content.split('</think>')[-1].lstrip() }}"
    "{%- else -%}{{ m.content or '' }}{%- endif -%}<|im_end|>{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}"
)
"""Qwen3's rule: an answer's reasoning is dropped once a later user turn exists."""

LONG_HEADER = (
    "{%- if messages | length > 16 -%}(a long conversation){{ '\\n' }}{%- endif -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content or '' }}<|im_end|>{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}"
)
"""Local for the probe's short conversations, not past 16 messages."""


@pytest.fixture
def tok() -> Any:
    return load_hf_tokenizer("demo")  # a fresh one: tests set their own templates


def _answer_text(turn: int, think: bool, plain: bool = False) -> str:
    if plain or turn % 3 == 2:
        return (f"<think>\nstep {turn}\n</think>\n\n" if think else "") + f"All done with step {turn}."
    # the demo template's own rendering of a tool call
    return '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls ' + str(turn) + '"}}\n</tool_call>'


def drive(
    ts: TitoSessions,
    tok: Any,
    turns: int,
    *,
    tools: list[dict[str, Any]] | None = TOOLS,
    reparse: bool = False,
    key: str = "s",
    user_every: int = 0,
    think: bool = False,
    plain: bool = False,
) -> list[tuple[list[int], dict[str, Any], list[dict[str, Any]]]]:
    """An agent session: each answer sent back (arguments re-serialized, as harnesses do) with a tool
    result, or a user turn every ``user_every`` turns. ``reparse``: each request's messages are
    fresh objects (a body parsed whole), else shared with the previous request's (the request
    parser's reuse). ``plain``: answers without tool calls (for templates that render none).
    ``think``: some answers reason first (the demo template does not render
    reasoning, so those prompts hold the model's own ids where the template has none). Returns each call's ``(prompt, decision, messages)``."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug in a.py."},
    ]
    out = []
    for t in range(turns):
        request = copy.deepcopy(msgs) if reparse else list(msgs)
        plan = ts.plan(key, request, tools)
        prompt, branch, version, decision, text = plan[:5]
        assert plan.json == orjson.dumps(list(prompt))  # the wire's JSON, kept per branch
        completion = list(tok.encode(_answer_text(t, think, plain), add_special_tokens=False)) + [
            tok.eos_token_id
        ]
        answer = parse_generation(tok.decode(completion, skip_special_tokens=False), tok.eos_token)
        ts.commit(key, branch, version, prompt, completion, request, answer, tools, text, plan.json)
        out.append((prompt, decision, request))
        back = dict(answer)
        if back.get("tool_calls"):  # the harness's own serialization of the arguments
            back["tool_calls"] = [
                {
                    **tc,
                    "function": {
                        **tc["function"],
                        "arguments": json.dumps(
                            json.loads(tc["function"]["arguments"]), separators=(",", ":")
                        ),
                    },
                }
                for tc in back["tool_calls"]
            ]
            nxt = [
                back,
                {"role": "tool", "tool_call_id": back["tool_calls"][0]["id"], "content": f"output {t} " * 30},
            ]
        else:
            nxt = [back]
        if (user_every and t % user_every == user_every - 1) or not back.get("tool_calls"):
            nxt.append({"role": "user", "content": f"Now step {t + 1}."})
        msgs = msgs + nxt
    return out


def rendered(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    from orchard_rec.dialects import template_message

    return str(
        tok.apply_chat_template(
            [template_message(m) for m in messages],
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
        )
    )


def check_prompts(
    tok: Any, calls: list[tuple[list[int], dict[str, Any], list[dict[str, Any]]]], tools: Any
) -> None:
    for prompt, _, messages in calls:
        assert tok.decode(prompt, skip_special_tokens=False) == rendered(tok, messages, tools)


@pytest.mark.parametrize("reparse", [False, True])
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_small_renderings_give_the_templates_prompts(tok: Any, reparse: bool, tools: Any) -> None:
    ts = TitoSessions(tok, verify_every=1)  # every small rendering checked against the whole one
    calls = drive(ts, tok, 30, tools=tools, reparse=reparse, user_every=4)
    check_prompts(tok, calls, tools)
    assert [d["fresh"] for _, d, _ in calls] == [True] + [False] * 29  # one branch throughout
    assert ts.incremental and ts.off_reason is None
    assert ts.small == 29 and ts.checked == 29
    for (p0, _, _), (p1, _, _) in itertools.pairwise(calls):  # each prompt extends the last exactly
        assert p1[: len(p0)] == p0


def test_reasoning_answers_keep_their_ids_as_the_whole_rendering_does(tok: Any) -> None:
    ts, whole = TitoSessions(tok, verify_every=1), TitoSessions(tok, incremental=False)
    a = drive(ts, tok, 24, think=True, user_every=5)
    b = drive(whole, tok, 24, think=True, user_every=5)
    assert [(p, d) for p, d, _ in a] == [(p, d) for p, d, _ in b]
    assert ts.small == 23 and ts.incremental


def test_a_late_call_renders_only_what_is_new(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = TitoSessions(tok, verify_every=10_000)
    lengths: list[int] = []
    real = tok.apply_chat_template

    def counting(msgs: Any, **kw: Any) -> Any:
        lengths.append(len(msgs))
        return real(msgs, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", counting)
    calls = drive(ts, tok, 60)
    late = lengths[-10 * 3 :]  # the last ten calls: their plans' and commits' renderings
    assert len(calls[-1][2]) > 90
    assert late and max(late) <= 6, late  # context (system, previous) + answer + new messages
    assert ts.small == 59 and ts.checked == 8
    monkeypatch.setattr(tok, "apply_chat_template", real)
    check_prompts(tok, calls, TOOLS)


@pytest.mark.parametrize("template", [NUMBERED, DROPS_OLD_REASONING], ids=["numbered", "drops-reasoning"])
def test_a_template_that_is_not_local_is_rendered_whole(tok: Any, template: str) -> None:
    tok.chat_template = template
    ts = TitoSessions(tok, verify_every=10_000)
    calls = drive(ts, tok, 12, tools=None, plain=True)
    assert not ts.incremental and ts.off_reason is not None and "probe" in ts.off_reason
    assert ts.small == 0
    check_prompts(tok, calls, None)


def test_a_difference_found_later_turns_small_renderings_off(
    tok: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tok.chat_template = LONG_HEADER
    ts, whole = TitoSessions(tok, verify_every=1), TitoSessions(tok, incremental=False)
    with caplog.at_level("WARNING", logger="orchard_rec.tito"):
        calls = drive(ts, tok, 14, tools=None, plain=True)
    assert ts.off_reason is not None and "long conversation" in ts.off_reason
    assert not ts.incremental and any("rendering whole conversations" in r.message for r in caplog.records)
    # the call that found it used the whole rendering: every prompt and decision as without them
    want = drive(whole, tok, 14, tools=None, plain=True)
    assert [(p, d) for p, d, _ in calls] == [(p, d) for p, d, _ in want]


def test_an_edited_history_forks_as_before(tok: Any) -> None:
    ts, whole = TitoSessions(tok, verify_every=1), TitoSessions(tok, incremental=False)
    a = drive(ts, tok, 6)
    b = drive(whole, tok, 6)
    assert [p for p, _, _ in a] == [p for p, _, _ in b]
    edited = copy.deepcopy(a[-1][2])
    edited[1]["content"] = "Fix the bug in b.py."
    got = ts.plan("s", edited, TOOLS)
    want = whole.plan("s", edited, TOOLS)
    assert got[0] == want[0] and got[3] == want[3] and got[3]["fresh"] is True
    assert ts.incremental


def test_image_digests_are_computed_once_per_image(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[str] = []
    real = tito_mod.decode_data_url

    def counting(url: str) -> Any:
        decoded.append(url)
        return real(url)

    monkeypatch.setattr(tito_mod, "decode_data_url", counting)
    url = "data:image/png;base64," + "iVBORw0KGgo" + "A" * 64 + "digest-once"
    msgs = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}],
        }
    ]
    first = chat_images(msgs)
    again = chat_images(copy.deepcopy(msgs))
    assert first == again and len(first) == 1 and decoded == [url]


@pytest.mark.parametrize(("env", "small"), [("", True), ("whole", False), ("WHOLE ", False)])
def test_orchard_tito_render_whole_turns_small_renderings_off(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, env: str, small: bool
) -> None:
    from orchard_rec.proxy.app import TITO, build_app
    from orchard_rec.proxy.config import ProxyConfig

    monkeypatch.setenv("ORCHARD_TITO_RENDER", env)
    cfg = ProxyConfig(
        upstream="http://127.0.0.1:9/v1",
        db=f"sqlite:///{tmp_path / 'o.db'}",
        spool=str(tmp_path / "spool"),
        mode="tito",
        tokenizer="demo",
    )
    app = build_app(cfg)
    assert app[TITO].incremental is small


def test_prompts_extend_the_branch_in_one_buffer_and_stay_exact(tok: Any) -> None:
    """A prompt is the branch's ``Ids`` extended in place (no copy of the shared ids; the writer
    knows the prefix by identity, ``Ids.starts_with``). A plan that never commits (the upstream
    failed) and two plans of one branch at once each keep their own ids: the later ones copy."""
    ts = TitoSessions(tok)
    calls = drive(ts, tok, 5)
    prompts = [p for p, _, _ in calls]
    assert all(isinstance(p, Ids) for p in prompts)
    assert all(b.starts_with(a) for a, b in itertools.pairwise(prompts))  # one buffer, by identity

    def want(req: list[dict[str, Any]]) -> list[int]:
        return list(tok.encode(rendered(tok, req, TOOLS), add_special_tokens=False))

    assert [list(p) for p in prompts] == [want(req) for _, _, req in calls]
    sixth = drive(TitoSessions(tok), tok, 6)[-1][2]  # continues ts's branch (the 5th answer, a result)
    reqs = [sixth, sixth + [{"role": "user", "content": "x"}], sixth + [{"role": "user", "content": "y"}]]
    plans = [ts.plan("s", r, TOOLS) for r in reqs]  # none committed: the first abandoned, two at once
    for plan, req in zip(plans, reqs, strict=True):
        assert plan.decision["fresh"] is False
        assert list(plan.prompt) == want(req)
        assert plan.json == orjson.dumps(want(req))
        assert plan.prompt.starts_with(prompts[-1]) == (plan is plans[0])  # the later ones copied
    ts.commit(
        "s",
        plans[2].branch,
        plans[2].version,
        plans[2].prompt,
        [5, 6],
        reqs[2],
        {"role": "assistant", "content": "ok"},
        TOOLS,
    )
    assert list(plans[0].prompt) == want(reqs[0]) and list(plans[1].prompt) == want(reqs[1])


def test_wire_body_writes_the_kept_json_for_the_prompt() -> None:
    prompt = Ids([1, 2, 3]).extend([40, 500])
    body = {"model": "m", "prompt": prompt, "max_tokens": 7, "stop": ["</s>"]}
    got = tito_mod.wire_body(body, prompt, b"[1,2,3,40,500]")
    assert got == orjson.dumps({**body, "prompt": [1, 2, 3, 40, 500]})


def test_branch_state_is_bounded_in_bytes(tok: Any) -> None:
    """Sessions are dropped least recently used first past ``max_bytes`` (their count kept exact as
    branches grow and fork); the one just used is always kept."""
    one = TitoSessions(tok)
    drive(one, tok, 4, key="x")
    size = one.bytes
    assert size == one._sessions["x"].size > 4 * len(one._sessions["x"].branches[0].tokens)
    ts = TitoSessions(tok, max_bytes=int(2.5 * size))
    for key in ("a", "b", "c"):
        drive(ts, tok, 4, key=key)
        assert ts.bytes == sum(s.size for s in ts._sessions.values()) <= ts.max_bytes
    assert list(ts._sessions) == ["b", "c"]
    ts.plan("b", [{"role": "user", "content": "hi"}], TOOLS)  # a plan is a use too
    drive(ts, tok, 2, key="d")
    assert list(ts._sessions) == ["b", "d"]
    tiny = TitoSessions(tok, max_bytes=1)
    drive(tiny, tok, 3, key="a")
    drive(tiny, tok, 2, key="b")
    assert list(tiny._sessions) == ["b"] and tiny.bytes == tiny._sessions["b"].size
