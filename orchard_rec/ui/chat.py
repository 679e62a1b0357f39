"""A recorded request or response as chat turns, whatever its dialect.

Each turn is ``{"role": ..., "blocks": [...]}``; a block is ``{"kind": "text" | "reasoning" |
"tool_call" | "tool_result" | "image", ...}`` with ``text`` (and ``name``/``id`` for tool calls
and results, ``url`` for images). Unknown shapes fall back to their JSON text: nothing is lost.
"""

from __future__ import annotations

from typing import Any

import orjson

from orchard_rec import dialects

__all__ = ["conversation", "response_turn"]

Block = dict[str, Any]
Turn = dict[str, Any]


def _json(v: Any) -> str:
    try:
        return orjson.dumps(v, option=orjson.OPT_INDENT_2).decode()
    except TypeError:
        return str(v)


def _args(v: Any) -> str:
    """Tool-call arguments, pretty when they are JSON."""
    if isinstance(v, str):
        try:
            return _json(orjson.loads(v))
        except orjson.JSONDecodeError:
            return v
    return _json(v)


def _text_of(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "\n".join(_text_of(p.get("text") if isinstance(p, dict) and "text" in p else p) for p in v)
    return _json(v)


def _image_url(part: dict[str, Any]) -> str | None:
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if isinstance(url, str):
        return url
    src = part.get("source")
    if isinstance(src, dict):
        if src.get("type") == "base64":
            return f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
        if isinstance(src.get("url"), str):
            return str(src["url"])
    return None


def _parts(content: Any) -> list[Block]:
    """Content (a string or a list of typed parts, any dialect) as blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"kind": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return [{"kind": "text", "text": _json(content)}]
    out: list[Block] = []
    for p in content:
        if isinstance(p, str):
            out.append({"kind": "text", "text": p})
            continue
        if not isinstance(p, dict):
            out.append({"kind": "text", "text": _json(p)})
            continue
        t = p.get("type")
        if t in ("text", "input_text", "output_text"):
            out.append({"kind": "text", "text": str(p.get("text", ""))})
        elif t in ("image_url", "input_image", "image"):
            url = _image_url(p)
            out.append({"kind": "image", "url": url or "", "text": "" if url else _json(p)})
        elif t in ("thinking", "redacted_thinking"):
            out.append({"kind": "reasoning", "text": str(p.get("thinking") or p.get("data") or "")})
        elif t == "tool_use":
            out.append(
                {"kind": "tool_call", "name": p.get("name"), "id": p.get("id"), "text": _args(p.get("input"))}
            )
        elif t == "tool_result":
            out.append(
                {"kind": "tool_result", "id": p.get("tool_use_id"), "text": _text_of(p.get("content"))}
            )
        elif t == "refusal":
            out.append({"kind": "text", "text": str(p.get("refusal", ""))})
        else:
            out.append({"kind": "text", "text": _json(p)})
    return out


def _chat_message(m: dict[str, Any]) -> Turn:
    role = str(m.get("role", "?"))
    blocks: list[Block] = []
    for key in ("reasoning_content", "reasoning"):
        if isinstance(m.get(key), str) and m[key]:
            blocks.append({"kind": "reasoning", "text": m[key]})
    if role == "tool":
        blocks.append(
            {"kind": "tool_result", "id": m.get("tool_call_id"), "text": _text_of(m.get("content"))}
        )
    else:
        blocks.extend(_parts(m.get("content")))
    for tc in m.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn = tc.get("function") or {}
            blocks.append(
                {
                    "kind": "tool_call",
                    "name": fn.get("name"),
                    "id": tc.get("id"),
                    "text": _args(fn.get("arguments")),
                }
            )
    return {"role": role, "blocks": blocks}


def _responses_item(item: Any) -> Turn:
    if not isinstance(item, dict):
        return {"role": "user", "blocks": [{"kind": "text", "text": _text_of(item)}]}
    t = item.get("type")
    if t == "function_call":
        return {
            "role": "assistant",
            "blocks": [
                {
                    "kind": "tool_call",
                    "name": item.get("name"),
                    "id": item.get("call_id"),
                    "text": _args(item.get("arguments")),
                }
            ],
        }
    if t == "function_call_output":
        return {
            "role": "tool",
            "blocks": [
                {"kind": "tool_result", "id": item.get("call_id"), "text": _text_of(item.get("output"))}
            ],
        }
    if t == "reasoning":
        text = "\n".join(_text_of(s.get("text")) for s in item.get("summary") or () if isinstance(s, dict))
        if not text:
            text = "\n".join(
                _text_of(s.get("text")) for s in item.get("content") or () if isinstance(s, dict)
            )
        return {"role": "assistant", "blocks": [{"kind": "reasoning", "text": text}]}
    if "role" in item:
        return {"role": str(item["role"]), "blocks": _parts(item.get("content"))}
    return {"role": "?", "blocks": [{"kind": "text", "text": _json(item)}]}


def _merge_adjacent(turns: list[Turn]) -> list[Turn]:
    """Responses items of one assistant turn (reasoning, text, calls) shown as one turn."""
    out: list[Turn] = []
    for t in turns:
        if out and t["role"] == "assistant" and out[-1]["role"] == "assistant":
            out[-1]["blocks"].extend(t["blocks"])
        else:
            out.append(t)
    return out


def conversation(request: Any, dialect: str) -> list[Turn]:
    """The turns a request sent (system prompt included)."""
    if not isinstance(request, dict):
        return (
            [] if request is None else [{"role": "?", "blocks": [{"kind": "text", "text": _json(request)}]}]
        )
    turns: list[Turn] = []
    if dialect == "messages":
        system = request.get("system")
        if system:
            turns.append({"role": "system", "blocks": _parts(system)})
        for m in request.get("messages") or ():
            if isinstance(m, dict):
                turns.append({"role": str(m.get("role", "?")), "blocks": _parts(m.get("content"))})
        return turns
    if dialect == "responses":
        if request.get("instructions"):
            turns.append({"role": "system", "blocks": _parts(request["instructions"])})
        inp = request.get("input")
        if isinstance(inp, str):
            turns.append({"role": "user", "blocks": _parts(inp)})
        elif isinstance(inp, list):
            turns.extend(_merge_adjacent([_responses_item(i) for i in inp]))
        return turns
    view = dialects.chat_request_of(dialect, request)  # any other dialect: its chat view (the registry's)
    if view is not None:
        request = view
    if isinstance(request.get("messages"), list):
        return [_chat_message(m) for m in request["messages"] if isinstance(m, dict)]
    if "prompt" in request:
        p = request["prompt"]
        text = (
            p if isinstance(p, str) else (f"{len(p)} prompt token ids" if isinstance(p, list) else _json(p))
        )
        return [{"role": "prompt", "blocks": [{"kind": "text", "text": text}]}]
    return turns


def response_turn(response: Any, dialect: str) -> Turn | None:
    """The assistant turn a response carried, or None (errors, non-generation calls)."""
    if not isinstance(response, dict):
        return None
    if dialect == "messages" and isinstance(response.get("content"), list):
        return {"role": "assistant", "blocks": _parts(response["content"])}
    if dialect == "responses" and isinstance(response.get("output"), list):
        merged = _merge_adjacent([_responses_item(i) for i in response["output"]])
        blocks = [b for t in merged for b in t["blocks"]]
        return {"role": "assistant", "blocks": blocks}
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c = choices[0]
        if isinstance(c.get("message"), dict):
            turn = _chat_message(c["message"])
            turn["role"] = "assistant"
            return turn
        if isinstance(c.get("text"), str):
            return {"role": "assistant", "blocks": [{"kind": "text", "text": c["text"]}]}
    msg = dialects.assistant_message(dialect, response)  # any other dialect, as a chat message
    if msg is not None and (msg.get("content") or msg.get("tool_calls") or msg.get("reasoning_content")):
        turn = _chat_message(msg)
        turn["role"] = "assistant"
        return turn
    return None
