"""Recorded requests and responses of every dialect as chat turns (what the session page shows)."""

from __future__ import annotations

from orchard_rec.ui.chat import conversation, response_turn


def kinds(turns):  # type: ignore[no-untyped-def]
    return [(t["role"], [b["kind"] for b in t["blocks"]]) for t in turns]


def test_chat_completions_with_images_reasoning_and_tools() -> None:
    req = {
        "messages": [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "thinking",
                "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        ]
    }
    turns = conversation(req, "chat")
    assert kinds(turns) == [
        ("system", ["text"]),
        ("user", ["text", "image"]),
        ("assistant", ["reasoning", "tool_call"]),
        ("tool", ["tool_result"]),
    ]
    assert turns[1]["blocks"][1]["url"].startswith("data:image/png")
    assert turns[2]["blocks"][1]["name"] == "ls" and '"a": 1' in turns[2]["blocks"][1]["text"]
    answer = response_turn({"choices": [{"message": {"role": "assistant", "content": "done"}}]}, "chat")
    assert answer == {"role": "assistant", "blocks": [{"kind": "text", "text": "done"}]}


def test_anthropic_messages_blocks() -> None:
    req = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QQ=="},
                    }
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm"},
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a\nb"}]},
        ],
    }
    turns = conversation(req, "messages")
    assert kinds(turns) == [
        ("system", ["text"]),
        ("user", ["image"]),
        ("assistant", ["reasoning", "tool_call"]),
        ("user", ["tool_result"]),
    ]
    assert turns[1]["blocks"][0]["url"] == "data:image/jpeg;base64,QQ=="
    resp = response_turn({"content": [{"type": "text", "text": "ok"}]}, "messages")
    assert resp is not None and resp["blocks"][0]["text"] == "ok"


def test_responses_items_merge_into_turns() -> None:
    req = {
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
            {"type": "function_call", "call_id": "f1", "name": "sh", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "f1", "output": "done"},
        ],
    }
    assert kinds(conversation(req, "responses")) == [
        ("system", ["text"]),
        ("user", ["text"]),
        ("assistant", ["reasoning", "tool_call"]),
        ("tool", ["tool_result"]),
    ]
    out = response_turn(
        {
            "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}
            ]
        },
        "responses",
    )
    assert out is not None and out["blocks"] == [{"kind": "text", "text": "x"}]


def test_unknown_shapes_are_shown_not_dropped() -> None:
    turns = conversation(
        {"messages": [{"role": "user", "content": [{"type": "audio", "data": "zz"}]}]}, "chat"
    )
    assert "audio" in turns[0]["blocks"][0]["text"]
    assert response_turn({"error": {"message": "bad"}}, "chat") is None
    assert conversation(None, "chat") == []
    assert conversation({"prompt": [1, 2, 3]}, "completions")[0]["blocks"][0]["text"] == "3 prompt token ids"
