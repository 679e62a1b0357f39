"""Messages -> chat translation details that come from real harness traffic."""

from __future__ import annotations

from orchard_rec.dialects.anthropic import to_chat as messages_to_chat


def test_claude_codes_billing_block_is_not_prompt() -> None:
    """Claude Code talking to api.anthropic.com (intercept) opens ``system`` with a billing block whose
    checksum changes per request; the model served elsewhere must not see it, or no two prompts share a prefix."""

    def body(cch: str) -> dict:  # type: ignore[type-arg]
        return {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "system": [
                {
                    "type": "text",
                    "text": f"x-anthropic-billing-header: cc_version=2.1.332.59c; cc_entrypoint=sdk-cli; cch={cch};",
                },
                {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            ],
        }

    a, b = messages_to_chat(body("df7a6")), messages_to_chat(body("4c729"))
    assert a == b
    assert a["messages"][0] == {"role": "system", "content": "You are a Claude agent."}
    plain = messages_to_chat(
        {
            "model": "m",
            "max_tokens": 8,
            "system": "x-anthropic-billing-header is discussed here",
            "messages": [],
        }
    )
    assert (
        plain["messages"][0]["content"] == "x-anthropic-billing-header is discussed here"
    )  # only the block form is dropped
