"""A small GUI-like agent for the demo's VLM mode, driven with the real ``openai`` SDK.

It behaves like a browser / computer-use harness (Orchard-GUI's generator): each step it sends
a screenshot of a fake web page (drawn with Pillow, so every step's image differs) as a chat
``image_url`` data URL, the model answers with a ``computer`` tool call, the agent "performs" it
on the page and attaches the next screenshot. Only the last ``keep`` screenshots stay in the
history (older ones are removed from their messages, their text kept), as Orchard's GUI recipe
keeps the last few: once one is dropped, the prompt no longer extends the previous one.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from typing import Any

import openai

from orchard_rec.demo.agent import _call

__all__ = ["COMPUTER_TOOL", "GuiRun", "run_gui_agent", "screenshot"]

COMPUTER_TOOL = {
    "type": "function",
    "function": {
        "name": "computer",
        "description": "Act on the browser page: 'click <element>', 'type <text>', 'scroll down'.",
        "parameters": {
            "type": "object",
            "properties": {"action": {"type": "string"}},
            "required": ["action"],
        },
    },
}

DEFAULT_TASK = (
    "Sign in to the shop and open the cart: run `click username` then run `type orchard` "
    "then run `click sign-in` then run `click cart`"
)

SIZES = ((224, 168), (112, 84), (320, 200))
"""Screenshot sizes, in turn (each becomes another number of image tokens)."""


def screenshot(step: int, actions: list[str], size: tuple[int, int] = (224, 168)) -> bytes:
    """A PNG of the fake page after ``actions`` (deterministic: the same arguments, the same bytes)."""
    from PIL import Image, ImageDraw

    w, h = size
    im = Image.new("RGB", size, (245, 245, 245))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 0, w - 1, max(12, h // 8)], fill=(40, 90, 160))
    d.text((4, 1), f"shop.example step {step}", fill=(255, 255, 255))
    for k, a in enumerate(actions[-4:]):
        y = h // 4 + k * max(10, h // 8)
        d.rectangle([6, y, w - 7, y + max(8, h // 10)], outline=(120, 120, 120), fill=(255, 255, 255))
        d.text((10, y), a[:30], fill=(20, 20, 20))
    d.ellipse([w - 24, h - 24, w - 6, h - 6], fill=((step * 53) % 256, (step * 97) % 256, 90))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _shot_message(text: str, png: bytes) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": _data_url(png)}},
        ],
    }


def _keep_last(messages: list[dict[str, Any]], keep: int) -> None:
    """Remove every image part but the last ``keep`` (in prompt order), keeping the text."""
    seen = 0
    for m in reversed(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        kept = []
        for p in reversed(content):
            if p.get("type") == "image_url":
                seen += 1
                if seen > keep:
                    continue
            kept.append(p)
        m["content"] = list(reversed(kept))


@dataclass
class GuiRun:
    messages: list[dict[str, Any]]
    """The final history."""
    shots: list[bytes] = field(default_factory=list)
    """Every screenshot taken, in order."""
    sent: list[list[bytes]] = field(default_factory=list)
    """Per call, the screenshots its prompt held, in order."""


def run_gui_agent(
    base_url: str,
    *,
    task: str = DEFAULT_TASK,
    keep: int = 3,
    stream: bool | None = None,
    model: str = "orchard-demo",
    max_steps: int = 12,
    api_key: str = "sk-demo",
) -> GuiRun:
    """Run the agent on one task; ``stream=None`` alternates streaming and not."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    actions: list[str] = []
    run = GuiRun([{"role": "system", "content": "You are a browser agent. Act with the computer tool."}])
    first = screenshot(0, actions, SIZES[0])
    run.shots.append(first)
    run.messages.append(_shot_message(task, first))
    for n in range(max_steps):
        _keep_last(run.messages, keep)
        run.sent.append(
            [
                base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
                for m in run.messages
                if isinstance(m.get("content"), list)
                for p in m["content"]
                if p.get("type") == "image_url"
            ]
        )
        msg = _call(client, model, run.messages, (n % 2 == 1) if stream is None else stream, COMPUTER_TOOL)
        run.messages.append(msg)
        if not msg.get("tool_calls"):
            break
        for tc in msg["tool_calls"]:
            action = str(json.loads(tc["function"]["arguments"] or "{}").get("action", ""))
            actions.append(action)
            run.messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"did: {action}"})
        shot = screenshot(len(actions), actions, SIZES[len(actions) % len(SIZES)])
        run.shots.append(shot)
        run.messages.append(_shot_message(f"Screenshot after step {len(actions)}", shot))
    return run
