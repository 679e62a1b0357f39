"""Pure translations between the Responses / Anthropic Messages dialects and Chat Completions.

Token-aware model servers (vLLM, SGLang) return token ids on chat completions, while
Codex speaks only Responses and Claude Code only Messages. In token mode the proxy
rewrites those requests into chat completions for the upstream and rewrites the answer
back, object or event stream. No I/O here: dicts in, dicts out, tested without HTTP.

Non-obvious bits:
- Responses ``namespace`` tools (Codex's ``multi_agent_v1``) are flattened; hosted tools
  (``web_search``, ``file_search`` ...) have no chat equivalent and are dropped.
- ``developer`` input messages become ``system`` messages; so do Claude Code's
  ``role: "system"`` entries inside ``messages``.
- Anthropic ``tool_result`` blocks become ``tool`` messages placed before the rest of
  that user turn, in block order; ``thinking`` blocks become ``reasoning_content``.
- Custom (free-form) Responses tools are exposed as functions taking ``{"input": str}``
  and mapped back to ``custom_tool_call`` items.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

__all__ = [
    "MessagesStream",
    "ResponsesStream",
    "assistant_message",
    "chat_request_of",
    "chat_to_messages",
    "chat_to_responses",
    "messages_to_chat",
    "responses_to_chat",
    "template_message",
]


def _hex() -> str:
    return uuid.uuid4().hex


def _text_of(content: Any) -> str:
    """Concatenate the text parts of a content value (str or list of parts/blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, dict):
                t = p.get("text")
                if isinstance(t, str):
                    out.append(t)
                elif p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str):
                    out.append(p["text"])
        return "".join(out)
    return str(content)


# ==== Responses -> chat =====================================================================


def _responses_content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        t = p.get("type")
        if t in ("input_text", "output_text", "text", "summary_text"):
            parts.append({"type": "text", "text": p.get("text", "")})
        elif t == "refusal":
            parts.append({"type": "text", "text": p.get("refusal", "")})
        elif t == "input_image":
            url = p.get("image_url") or p.get("file_id")
            if url:
                parts.append(
                    {"type": "image_url", "image_url": {"url": url, "detail": p.get("detail", "auto")}}
                )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _responses_tools(tools: Any) -> tuple[list[dict[str, Any]], set[str], list[str]]:
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    dropped: list[str] = []
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        kind = t.get("type")
        if kind == "function":
            fn = {
                "name": t.get("name"),
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            }
            if t.get("description"):
                fn["description"] = t["description"]
            out.append({"type": "function", "function": fn})
        elif kind == "namespace":
            sub, sub_custom, sub_dropped = _responses_tools(t.get("tools"))
            out.extend(sub)
            custom |= sub_custom
            dropped.extend(sub_dropped)
        elif kind == "custom":
            custom.add(t.get("name"))
            fn = {
                "name": t.get("name"),
                "description": t.get("description") or "",
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string"}},
                    "required": ["input"],
                },
            }
            out.append({"type": "function", "function": fn})
        else:
            dropped.append(str(kind))
    return out, custom, dropped


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as a chat completions request."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": _text_of(body["instructions"])})
    inp = body.get("input")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    pending_reasoning: str | None = None
    for item in inp if isinstance(inp, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        last = messages[-1] if messages else None
        if kind == "message":
            role = item.get("role", "user")
            if role == "developer":
                role = "system"
            msg: dict[str, Any] = {"role": role, "content": _responses_content(item.get("content"))}
            if role == "assistant" and pending_reasoning:
                msg["reasoning_content"] = pending_reasoning
                pending_reasoning = None
            messages.append(msg)
        elif kind == "reasoning":
            text = _text_of(item.get("content")) or _text_of(item.get("summary"))
            pending_reasoning = (pending_reasoning or "") + text
        elif kind in ("function_call", "custom_tool_call"):
            args = (
                item.get("arguments")
                if kind == "function_call"
                else orjson.dumps({"input": item.get("input", "")}).decode()
            )
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": args or ""},
            }
            if last is not None and last["role"] == "assistant" and not last.get("_closed"):
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if pending_reasoning:
                    msg["reasoning_content"] = pending_reasoning
                    pending_reasoning = None
                messages.append(msg)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _text_of(out) if not isinstance(out, str) else out,
                }
            )
        # item_reference and unknown items carry nothing a chat model can see
    for m in messages:
        m.pop("_closed", None)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools, _custom, _dropped = _responses_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, str):
        chat["tool_choice"] = tc
    elif isinstance(tc, dict) and tc.get("name"):
        chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for k in (
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "stream",
        "user",
        "seed",
        "stop",
        "top_logprobs",
    ):
        if body.get(k) is not None:
            chat[k] = body[k]
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort:
        chat["reasoning_effort"] = effort
    return chat


def responses_custom_tools(body: dict[str, Any]) -> set[str]:
    return _responses_tools(body.get("tools"))[1]


# ==== chat -> Responses =====================================================================


def _usage_responses(u: Any) -> dict[str, Any] | None:
    if not isinstance(u, dict):
        return None
    return {
        "input_tokens": u.get("prompt_tokens", 0),
        "input_tokens_details": {
            "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        },
        "output_tokens": u.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.get("total_tokens", u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)),
    }


def _response_shell(req: dict[str, Any], rid: str, created: int, status: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": req.get("model"),
        "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": req.get("previous_response_id"),
        "reasoning": req.get("reasoning") or {"effort": None, "summary": None},
        "store": req.get("store", False),
        "temperature": req.get("temperature"),
        "text": req.get("text") or {"format": {"type": "text"}},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p"),
        "truncation": req.get("truncation", "disabled"),
        "usage": None,
        "metadata": req.get("metadata") or {},
    }


def _call_item(
    call_id: str, name: str, arguments: str, custom: set[str], status: str = "completed"
) -> dict[str, Any]:
    if name in custom:
        try:
            inp = orjson.loads(arguments).get("input", "")
        except (orjson.JSONDecodeError, AttributeError):
            inp = arguments
        return {
            "type": "custom_tool_call",
            "id": "ctc_" + _hex(),
            "call_id": call_id,
            "name": name,
            "input": inp,
            "status": status,
        }
    return {
        "type": "function_call",
        "id": "fc_" + _hex(),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def chat_to_responses(chat: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """A chat completion (non-stream) as a Responses object answering ``req``."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    finish = choice.get("finish_reason")
    resp = _response_shell(req, "resp_" + _hex(), int(chat.get("created") or time.time()), "completed")
    custom = responses_custom_tools(req)
    out = resp["output"]
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        out.append(
            {
                "type": "reasoning",
                "id": "rs_" + _hex(),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if msg.get("content"):
        out.append(
            {
                "type": "message",
                "id": "msg_" + _hex(),
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": msg["content"], "annotations": [], "logprobs": []}
                ],
            }
        )
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function") or {}
        out.append(
            _call_item(tc.get("id") or "call_" + _hex(), fn.get("name", ""), fn.get("arguments", ""), custom)
        )
    if finish == "length":
        resp["status"] = "incomplete"
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    resp["usage"] = _usage_responses(chat.get("usage"))
    return resp


class ResponsesStream:
    """Turns chat completion chunks into the Responses API's event sequence.

    ``feed(chunk)`` and ``finish()`` return ``[(event_name, data), ...]``; every data
    carries ``type`` (= the event name) and a growing ``sequence_number``.
    """

    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.custom = responses_custom_tools(req)
        self.seq = 0
        self.resp = _response_shell(req, "resp_" + _hex(), int(time.time()), "in_progress")
        self.started = False
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.open_kind: str | None = None
        self.tool_index: int | None = None
        self.finish_reason: str | None = None
        self.usage: Any = None

    def _ev(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        d = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return kind, d

    def _start(self) -> list[tuple[str, dict[str, Any]]]:
        self.started = True
        snap = dict(self.resp)
        return [
            self._ev("response.created", response=snap),
            self._ev("response.in_progress", response=dict(snap)),
        ]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        item, kind = self.open, self.open_kind
        if item is None:
            return []
        self.open = self.open_kind = None
        idx = len(self.items)
        evs: list[tuple[str, dict[str, Any]]] = []
        if kind == "message":
            part = item["content"][0]
            evs.append(
                self._ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            evs.append(
                self._ev(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    part=dict(part),
                )
            )
            item["status"] = "completed"
        elif kind == "reasoning":
            text = item["content"][0]["text"]
            evs.append(
                self._ev(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    text=text,
                )
            )
        elif kind == "call":
            item = _call_item(item["call_id"], item["name"], item["arguments"], self.custom)
            item["id"] = self._call_id_item
            if item["type"] == "function_call":
                evs.append(
                    self._ev(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=idx,
                        name=item["name"],
                        arguments=item["arguments"],
                    )
                )
            else:
                evs.append(
                    self._ev(
                        "response.custom_tool_call_input.done",
                        item_id=item["id"],
                        output_index=idx,
                        input=item["input"],
                    )
                )
        evs.append(self._ev("response.output_item.done", output_index=idx, item=item))
        self.items.append(item)
        return evs

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        evs = [] if self.started else self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                continue
            d = c.get("delta") or {}
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                if self.open_kind != "reasoning":
                    evs += self._close()
                    self.open = {
                        "type": "reasoning",
                        "id": "rs_" + _hex(),
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}],
                    }
                    self.open_kind = "reasoning"
                    evs.append(
                        self._ev(
                            "response.output_item.added",
                            output_index=len(self.items),
                            item={**self.open, "content": []},
                        )
                    )
                self.open["content"][0]["text"] += r
                evs.append(
                    self._ev(
                        "response.reasoning_text.delta",
                        item_id=self.open["id"],
                        output_index=len(self.items),
                        content_index=0,
                        delta=r,
                    )
                )
            if d.get("content"):
                if self.open_kind != "message":
                    evs += self._close()
                    self.open = {
                        "type": "message",
                        "id": "msg_" + _hex(),
                        "status": "in_progress",
                        "role": "assistant",
                        "content": [],
                    }
                    self.open_kind = "message"
                    idx = len(self.items)
                    evs.append(
                        self._ev(
                            "response.output_item.added", output_index=idx, item={**self.open, "content": []}
                        )
                    )
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    self.open["content"].append(part)
                    evs.append(
                        self._ev(
                            "response.content_part.added",
                            item_id=self.open["id"],
                            output_index=idx,
                            content_index=0,
                            part=dict(part),
                        )
                    )
                self.open["content"][0]["text"] += d["content"]
                evs.append(
                    self._ev(
                        "response.output_text.delta",
                        item_id=self.open["id"],
                        output_index=len(self.items),
                        content_index=0,
                        delta=d["content"],
                        logprobs=[],
                    )
                )
            for tc in d.get("tool_calls") or ():
                ti = tc.get("index", 0)
                fn = tc.get("function") or {}
                if self.open_kind != "call" or self.tool_index != ti:
                    evs += self._close()
                    self.tool_index = ti
                    self.open_kind = "call"
                    self.open = {
                        "call_id": tc.get("id") or "call_" + _hex(),
                        "name": fn.get("name") or "",
                        "arguments": "",
                    }
                    self._call_id_item = ("ctc_" if self.open["name"] in self.custom else "fc_") + _hex()
                    added = _call_item(
                        self.open["call_id"], self.open["name"], "", self.custom, status="in_progress"
                    )
                    added["id"] = self._call_id_item
                    evs.append(
                        self._ev("response.output_item.added", output_index=len(self.items), item=added)
                    )
                elif fn.get("name"):
                    self.open["name"] += fn["name"]
                if fn.get("arguments"):
                    self.open["arguments"] += fn["arguments"]
                    if self.open["name"] in self.custom:
                        continue  # custom tool input is only known once the JSON wrapper is complete
                    evs.append(
                        self._ev(
                            "response.function_call_arguments.delta",
                            item_id=self._call_id_item,
                            output_index=len(self.items),
                            delta=fn["arguments"],
                        )
                    )
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
        return evs

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        evs = [] if self.started else self._start()
        evs += self._close()
        final = dict(self.resp)
        final["output"] = self.items
        final["usage"] = _usage_responses(self.usage)
        if self.finish_reason == "length":
            final["status"] = "incomplete"
            final["incomplete_details"] = {"reason": "max_output_tokens"}
            evs.append(self._ev("response.incomplete", response=final))
        else:
            final["status"] = "completed"
            evs.append(self._ev("response.completed", response=final))
        self.final = final
        return evs


# ==== Anthropic Messages -> chat ===============================================================


def _anthropic_parts(blocks: list[Any]) -> Any:
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, str):
            parts.append({"type": "text", "text": b})
        elif isinstance(b, dict):
            t = b.get("type")
            if t == "text":
                parts.append({"type": "text", "text": b.get("text", "")})
            elif t == "image":
                src = b.get("source") or {}
                if src.get("type") == "base64":
                    url = f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
                else:
                    url = src.get("url", "")
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif t == "document":
                src = b.get("source") or {}
                if src.get("type") == "text":
                    parts.append({"type": "text", "text": src.get("data", "")})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _tool_result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return content if isinstance(content, str) else ("" if content is None else str(content))


_BILLING = "x-anthropic-billing-header:"


def _without_billing_block(system: Any) -> Any:
    """Claude Code, talking to api.anthropic.com itself (intercept mode), opens its system prompt
    with a text block ``x-anthropic-billing-header: ...; cch=<checksum>;`` whose checksum changes
    on every request. It is accounting for Anthropic's API, not prompt: a model served elsewhere
    should not read it, and kept it would break every session's token prefix at its first line."""
    if isinstance(system, list):  # the form Claude Code sends (2.1.332); a plain string is left as it is
        return [
            b
            for b in system
            if not (isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"].startswith(_BILLING))
        ]
    return system


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as a chat completions request."""
    messages: list[dict[str, Any]] = []
    system = _without_billing_block(body.get("system"))
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        content = m.get("content")
        if role == "system":
            messages.append({"role": "system", "content": _text_of(content)})
            continue
        if isinstance(content, str) or content is None:
            messages.append({"role": role, "content": content or ""})
            continue
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": None}
            texts: list[dict[str, Any]] = []
            for b in content:
                if not isinstance(b, dict):
                    continue
                t = b.get("type")
                if t == "thinking":
                    msg["reasoning_content"] = (msg.get("reasoning_content") or "") + b.get("thinking", "")
                elif t == "tool_use":
                    msg.setdefault("tool_calls", []).append(
                        {
                            "id": b.get("id"),
                            "type": "function",
                            "function": {
                                "name": b.get("name"),
                                "arguments": orjson.dumps(b.get("input", {})).decode(),
                            },
                        }
                    )
                elif t == "text":
                    texts.append(b)
            if texts:
                msg["content"] = _anthropic_parts(texts)
            messages.append(msg)
            continue
        rest: list[Any] = []
        for b in content:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                text = _tool_result_text(b.get("content"))
                messages.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
            else:
                rest.append(b)
        if rest:
            messages.append({"role": role or "user", "content": _anthropic_parts(rest)})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = []
    for t in body.get("tools") or ():
        if isinstance(t, dict) and "input_schema" in t:
            fn = {
                "name": t.get("name"),
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            }
            if t.get("description"):
                fn["description"] = t["description"]
            tools.append({"type": "function", "function": fn})
    if tools:
        chat["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        if kind == "auto":
            chat["tool_choice"] = "auto"
        elif kind == "any":
            chat["tool_choice"] = "required"
        elif kind == "none":
            chat["tool_choice"] = "none"
        elif kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
        if tc.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    for k in ("temperature", "top_p", "top_k", "stream"):
        if body.get(k) is not None:
            chat[k] = body[k]
    return chat


# ==== chat -> Anthropic Messages ===============================================================

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def _stop_reason(finish: str | None, has_tools: bool, stop_sequence: Any) -> str:
    if has_tools:
        return "tool_use"
    if stop_sequence:
        return "stop_sequence"
    return _STOP.get(finish or "stop", "end_turn")


def _usage_messages(u: Any) -> dict[str, Any]:
    u = u if isinstance(u, dict) else {}
    return {
        "input_tokens": u.get("prompt_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": u.get("completion_tokens", 0),
    }


def _tool_input(arguments: str) -> Any:
    try:
        v = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def chat_to_messages(chat: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """A chat completion (non-stream) as an Anthropic message answering ``req``."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    calls = msg.get("tool_calls") or []
    for tc in calls:
        fn = tc.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tc.get("id") or "toolu_" + _hex(),
                "name": fn.get("name", ""),
                "input": _tool_input(fn.get("arguments", "")),
            }
        )
    stop_seq = choice.get("stop_reason") if isinstance(choice.get("stop_reason"), str) else None
    return {
        "id": "msg_" + _hex(),
        "type": "message",
        "role": "assistant",
        "model": req.get("model") or chat.get("model"),
        "content": content,
        "stop_reason": _stop_reason(choice.get("finish_reason"), bool(calls), stop_seq),
        "stop_sequence": stop_seq,
        "usage": _usage_messages(chat.get("usage")),
    }


class MessagesStream:
    """Turns chat completion chunks into Anthropic's Messages event sequence."""

    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.started = False
        self.index = -1
        self.open_kind: str | None = None
        self.tool_index: int | None = None
        self.finish_reason: str | None = None
        self.stop_sequence: Any = None
        self.usage: Any = None
        self.any_tool = False
        self.msg = {
            "id": "msg_" + _hex(),
            "type": "message",
            "role": "assistant",
            "model": req.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }

    def _start(self, prompt_tokens: int) -> list[tuple[str, dict[str, Any]]]:
        self.started = True
        self.msg["usage"]["input_tokens"] = prompt_tokens
        return [
            ("message_start", {"type": "message_start", "message": dict(self.msg)}),
            ("ping", {"type": "ping"}),
        ]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open_kind is None:
            return []
        evs: list[tuple[str, dict[str, Any]]] = []
        if self.open_kind == "thinking":
            evs.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self.index,
                        "delta": {"type": "signature_delta", "signature": ""},
                    },
                )
            )
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open_kind = None
        return evs

    def _open(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        evs = self._close()
        self.index += 1
        self.open_kind = kind
        evs.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return evs

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        evs: list[tuple[str, dict[str, Any]]] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not self.started:
            n = len(chunk.get("prompt_token_ids") or ()) or (
                (chunk.get("usage") or {}).get("prompt_tokens") or 0
            )
            evs += self._start(n)
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                continue
            d = c.get("delta") or {}
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                if self.open_kind != "thinking":
                    evs += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                evs.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.index,
                            "delta": {"type": "thinking_delta", "thinking": r},
                        },
                    )
                )
            if d.get("content"):
                if self.open_kind != "text":
                    evs += self._open("text", {"type": "text", "text": ""})
                evs.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.index,
                            "delta": {"type": "text_delta", "text": d["content"]},
                        },
                    )
                )
            for tc in d.get("tool_calls") or ():
                ti = tc.get("index", 0)
                fn = tc.get("function") or {}
                if self.open_kind != "tool_use" or self.tool_index != ti:
                    self.tool_index = ti
                    self.any_tool = True
                    evs += self._open(
                        "tool_use",
                        {
                            "type": "tool_use",
                            "id": tc.get("id") or "toolu_" + _hex(),
                            "name": fn.get("name") or "",
                            "input": {},
                        },
                    )
                if fn.get("arguments"):
                    evs.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": self.index,
                                "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                            },
                        )
                    )
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
                if isinstance(c.get("stop_reason"), str):
                    self.stop_sequence = c["stop_reason"]
        return evs

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        evs = [] if self.started else self._start(0)
        evs += self._close()
        usage = _usage_messages(self.usage)
        stop = _stop_reason(self.finish_reason, self.any_tool, self.stop_sequence)
        evs.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": self.stop_sequence},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        evs.append(("message_stop", {"type": "message_stop"}))
        return evs


# ==== any dialect's answer -> the assistant chat message ============================================


def assistant_message(dialect: str, response: Any) -> dict[str, Any] | None:
    """The assistant turn a response represents, as a chat message (for retokenization)."""
    if not isinstance(response, dict):
        return None
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    calls: list[dict[str, Any]] = []
    if dialect == "chat":
        m = ((response.get("choices") or [{}])[0] or {}).get("message") or {}
        msg["content"] = m.get("content")
        if m.get("reasoning_content") or m.get("reasoning"):
            msg["reasoning_content"] = m.get("reasoning_content") or m.get("reasoning")
        calls = list(m.get("tool_calls") or [])
    elif dialect == "responses":
        texts: list[str] = []
        for item in response.get("output") or ():
            kind = item.get("type")
            if kind == "message":
                texts.append(_text_of(item.get("content")))
            elif kind == "reasoning":
                msg["reasoning_content"] = (msg.get("reasoning_content") or "") + (
                    _text_of(item.get("content")) or _text_of(item.get("summary"))
                )
            elif kind == "function_call":
                calls.append(
                    {
                        "id": item.get("call_id"),
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                    }
                )
            elif kind == "custom_tool_call":
                calls.append(
                    {
                        "id": item.get("call_id"),
                        "type": "function",
                        "function": {
                            "name": item.get("name"),
                            "arguments": orjson.dumps({"input": item.get("input", "")}).decode(),
                        },
                    }
                )
        msg["content"] = "".join(texts) or None
    elif dialect == "messages":
        texts = []
        for b in response.get("content") or ():
            kind = b.get("type")
            if kind == "text":
                texts.append(b.get("text", ""))
            elif kind == "thinking":
                msg["reasoning_content"] = (msg.get("reasoning_content") or "") + b.get("thinking", "")
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": b.get("id"),
                        "type": "function",
                        "function": {
                            "name": b.get("name"),
                            "arguments": orjson.dumps(b.get("input", {})).decode(),
                        },
                    }
                )
        msg["content"] = "".join(texts) or None
    else:
        return None
    if calls:
        msg["tool_calls"] = calls
    return msg


def chat_request_of(dialect: str, request: Any) -> dict[str, Any] | None:
    """The chat-completions view of a recorded request of any generation dialect."""
    if not isinstance(request, dict):
        return None
    if dialect == "chat":
        return request
    if dialect == "responses":
        return responses_to_chat(request)
    if dialect == "messages":
        return messages_to_chat(request)
    return None


# ==== messages as chat templates read them ========================================================


def _template_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        )
    return str(content)


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message as chat templates want it (as vLLM hands it over): text content, tool-call arguments as objects."""
    out = dict(m)
    out["content"] = _template_text(m.get("content"))
    if m.get("tool_calls"):
        calls = []
        for tc in m["tool_calls"]:
            fn = dict(tc.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = orjson.loads(args) if args else {}
                except orjson.JSONDecodeError:
                    pass
            calls.append({**tc, "function": fn})
        out["tool_calls"] = calls
    return out
