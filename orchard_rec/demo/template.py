"""The demo model's chat template: ChatML with Hermes/Qwen-style tool calls.

Like Qwen3's template, reasoning (``reasoning_content``) of earlier assistant turns
is dropped when the history is rendered, and tool results are wrapped in
``<tool_response>`` inside a user turn. ``CHAT_TEMPLATE`` is the same template in Jinja
(saved with the demo tokenizer, for ``transformers``' ``apply_chat_template``); a test
checks that both render every conversation identically. Like vLLM, callers hand the
Jinja template tool-call arguments as objects, not JSON strings.

Content may be a string or a list of parts (vLLM hands list content to templates that iterate
it, as this one does, through a macro vLLM's content-format detection follows): text parts are
concatenated and each image part (``image``, ``image_url``, ``input_image``) renders as
Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CHAT_TEMPLATE", "IMAGE_MARKUP", "render", "render_tool_call"]

_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


IMAGE_MARKUP = "<|vision_start|><|image_pad|><|vision_end|>"
"""What an image part renders as (Qwen2-VL's template); the server expands the pad (``demo.vision``)."""
_IMAGE_PARTS = ("image", "image_url", "input_image")


def _content(c: Any) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        out = []
        for p in c:
            if isinstance(p, dict):
                if p.get("type") in _IMAGE_PARTS or "image" in p or "image_url" in p:
                    out.append(IMAGE_MARKUP)
                elif "text" in p:
                    out.append(str(p["text"]))
            elif isinstance(p, str):
                out.append(p)
        return "".join(out)
    return str(c)


def render_tool_call(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "\n</tool_call>"
    )


def render(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    out: list[str] = []
    msgs = list(messages)
    system = ""
    if msgs and msgs[0].get("role") == "system":
        system = _content(msgs[0].get("content"))
        msgs = msgs[1:]
    if tools:
        body = system + _TOOLS_HEADER
        for t in tools:
            body += "\n" + json.dumps(t, ensure_ascii=False)
        out.append("<|im_start|>system\n" + body + _TOOLS_FOOTER + "<|im_end|>\n")
    elif system:
        out.append("<|im_start|>system\n" + system + "<|im_end|>\n")
    i = 0
    while i < len(msgs):
        m = msgs[i]
        role = m.get("role")
        if role == "tool":
            parts = []
            while i < len(msgs) and msgs[i].get("role") == "tool":
                parts.append("<tool_response>\n" + _content(msgs[i].get("content")) + "\n</tool_response>")
                i += 1
            out.append("<|im_start|>user\n" + "\n".join(parts) + "<|im_end|>\n")
            continue
        if role == "assistant":
            text = _content(m.get("content"))
            calls = [
                render_tool_call(
                    (tc.get("function") or {}).get("name", ""),
                    (tc.get("function") or {}).get("arguments", ""),
                )
                for tc in m.get("tool_calls") or ()
            ]
            if calls:
                text = (text + "\n" if text else "") + "\n".join(calls)
            out.append("<|im_start|>assistant\n" + text + "<|im_end|>\n")
        else:
            out.append("<|im_start|>" + str(role) + "\n" + _content(m.get("content")) + "<|im_end|>\n")
        i += 1
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


_NL = "{{ '\\n' }}"
_C = (
    "{%- macro render_content(c) -%}"
    "{%- if c is none -%}"
    "{%- elif c is string -%}{{ c }}"
    "{%- elif c is iterable and c is not mapping -%}"
    "{%- for p in c -%}"
    "{%- if p is string -%}{{ p }}"
    "{%- elif p.type in ['image', 'image_url', 'input_image'] or 'image' in p or 'image_url' in p -%}"
    + IMAGE_MARKUP
    + "{%- elif 'text' in p -%}{{ p.text }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ c }}"
    "{%- endif -%}"
    "{%- endmacro -%}"
)
CHAT_TEMPLATE = (
    _C + "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system = render_content(messages[0].content) -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- if tools -%}"
    "<|im_start|>system"
    + _NL
    + "{{ system }}"
    + _TOOLS_HEADER.replace("\n", _NL)
    + "{%- for t in tools -%}"
    + _NL
    + "{{ t | tojson }}{%- endfor -%}"
    + _TOOLS_FOOTER.replace("\n", _NL)
    .replace('{"name"', "{{ '{' }}\"name\"")
    .replace("object>}", "object>{{ '}' }}")
    + "<|im_end|>"
    + _NL
    + "{%- elif system -%}<|im_start|>system"
    + _NL
    + "{{ system }}<|im_end|>"
    + _NL
    + "{%- endif -%}"
    "{%- for m in loop_messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or loop_messages[loop.index0 - 1].role != 'tool' -%}<|im_start|>user"
    + _NL
    + "{%- else -%}"
    + _NL
    + "{%- endif -%}"
    "<tool_response>" + _NL + "{{ render_content(m.content) }}" + _NL + "</tool_response>"
    "{%- if loop.last or loop_messages[loop.index0 + 1].role != 'tool' -%}<|im_end|>" + _NL + "{%- endif -%}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set text = render_content(m.content) -%}"
    "<|im_start|>assistant" + _NL + "{{ text }}"
    "{%- for tc in m.tool_calls or [] -%}"
    "{%- if text or not loop.first -%}" + _NL + "{%- endif -%}"
    "<tool_call>"
    + _NL
    + "{{ '{' }}\"name\": {{ tc.function.name | tojson }}, \"arguments\": {{ tc.function.arguments | tojson }}{{ '}' }}"
    + _NL
    + "</tool_call>"
    "{%- endfor -%}"
    "<|im_end|>"
    + _NL
    + "{%- else -%}<|im_start|>{{ m.role }}"
    + _NL
    + "{{ render_content(m.content) }}<|im_end|>"
    + _NL
    + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant" + _NL + "{%- endif -%}"
)
