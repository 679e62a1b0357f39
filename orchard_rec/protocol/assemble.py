"""Rebuild the object a non-stream call would have returned from a stream's events.

Runs in the recorder's writer thread, off the response path. One function per
dialect; each takes the parsed events ``[(event_name, data_obj), ...]`` and returns
the final object. ``extract_tokens`` then reads the vLLM-specific token fields
(``prompt_token_ids``, ``token_ids``) and logprobs from a final object.

Quirks kept here:
- vLLM sends ``prompt_token_ids`` on the first chat chunk only, ``system_fingerprint``
  on the last only, and per-chunk ``choices[i].token_ids`` deltas; completions put ``prompt_token_ids`` on the choice.
- Anthropic streams ``input_json_delta`` fragments: the tool input is parsed once
  the block stops; a fragment stream that is not valid JSON is kept as a string.
"""

from __future__ import annotations

from typing import Any

import orjson

from orchard_rec.records import Dialect

__all__ = ["assemble", "extract_tokens"]


def assemble(dialect: Dialect, events: list[tuple[str | None, Any]]) -> Any:
    if dialect is Dialect.CHAT:
        return _chat(events)
    if dialect is Dialect.COMPLETIONS:
        return _completions(events)
    if dialect is Dialect.RESPONSES:
        return _responses(events)
    if dialect is Dialect.MESSAGES:
        return _messages(events)
    return None


def _data_objects(events: list[tuple[str | None, Any]]) -> list[dict[str, Any]]:
    return [d for _, d in events if isinstance(d, dict)]


def _chat(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    chunks = _data_objects(events)
    if not chunks:
        return None
    first = chunks[0]
    out: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion",
        "created": first.get("created"),
        "model": first.get("model"),
    }
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for ch in chunks:
        if ch.get("prompt_token_ids") is not None and "prompt_token_ids" not in out:
            out["prompt_token_ids"] = list(ch["prompt_token_ids"])
        if ch.get("usage"):
            usage = ch["usage"]
        if ch.get("system_fingerprint") is not None:  # vLLM sends it in the last chunk only
            out["system_fingerprint"] = ch["system_fingerprint"]
        for c in ch.get("choices") or ():
            idx = c.get("index", 0)
            acc = choices.setdefault(
                idx,
                {
                    "index": idx,
                    "message": {"role": "assistant", "content": None},
                    "finish_reason": None,
                    "_tools": {},
                },
            )
            delta = c.get("delta") or {}
            msg = acc["message"]
            if delta.get("role"):
                msg["role"] = delta["role"]
            for key in ("content", "reasoning_content", "reasoning", "refusal"):
                piece = delta.get(key)
                if piece:
                    msg[key] = (msg.get(key) or "") + piece
            for tc in delta.get("tool_calls") or ():
                t = acc["_tools"].setdefault(
                    tc.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.get("id"):
                    t["id"] = tc["id"]
                if tc.get("type"):
                    t["type"] = tc["type"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    t["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    t["function"]["arguments"] += fn["arguments"]
            lp = c.get("logprobs")
            if lp and lp.get("content"):
                acc.setdefault("logprobs", {"content": []})["content"].extend(lp["content"])
            if c.get("token_ids") is not None:
                acc.setdefault("token_ids", []).extend(c["token_ids"])
            if c.get("finish_reason") is not None:
                acc["finish_reason"] = c["finish_reason"]
            if c.get("stop_reason") is not None:
                acc["stop_reason"] = c["stop_reason"]
    out["choices"] = []
    for idx in sorted(choices):
        acc = choices[idx]
        tools = acc.pop("_tools")
        if tools:
            acc["message"]["tool_calls"] = [tools[i] for i in sorted(tools)]
        out["choices"].append(acc)
    if usage is not None:
        out["usage"] = usage
    return out


def _completions(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    chunks = _data_objects(events)
    if not chunks:
        return None
    first = chunks[0]
    out: dict[str, Any] = {
        "id": first.get("id"),
        "object": "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
    }
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for ch in chunks:
        if ch.get("usage"):
            usage = ch["usage"]
        for c in ch.get("choices") or ():
            idx = c.get("index", 0)
            acc = choices.setdefault(idx, {"index": idx, "text": "", "finish_reason": None})
            acc["text"] += c.get("text") or ""
            if c.get("prompt_token_ids") is not None and "prompt_token_ids" not in acc:
                acc["prompt_token_ids"] = list(c["prompt_token_ids"])
            if c.get("token_ids") is not None:
                acc.setdefault("token_ids", []).extend(c["token_ids"])
            lp = c.get("logprobs")
            if lp:
                dst = acc.setdefault(
                    "logprobs", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                )
                for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    if lp.get(k):
                        dst[k].extend(lp[k])
            if c.get("finish_reason") is not None:
                acc["finish_reason"] = c["finish_reason"]
    out["choices"] = [choices[i] for i in sorted(choices)]
    if usage is not None:
        out["usage"] = usage
    return out


def _responses(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    final = None
    latest = None
    for name, data in events:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = data.get("response")
        elif isinstance(data.get("response"), dict):
            latest = data["response"]
    return final if final is not None else latest


def _messages(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    msg: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, str] = {}
    for name, data in events:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind == "message_start":
            msg = dict(data.get("message") or {})
            msg["content"] = list(msg.get("content") or [])
        elif kind == "content_block_start":
            idx = data.get("index", len(blocks))
            blocks[idx] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            idx = data.get("index", 0)
            b = blocks.setdefault(idx, {})
            d = data.get("delta") or {}
            dt = d.get("type")
            if dt == "text_delta":
                b["text"] = (b.get("text") or "") + d.get("text", "")
            elif dt == "input_json_delta":
                partial_json[idx] = partial_json.get(idx, "") + d.get("partial_json", "")
            elif dt == "thinking_delta":
                b["thinking"] = (b.get("thinking") or "") + d.get("thinking", "")
            elif dt == "signature_delta":
                b["signature"] = (b.get("signature") or "") + d.get("signature", "")
            elif dt == "citations_delta":
                b.setdefault("citations", []).append(d.get("citation"))
        elif kind == "content_block_stop":
            idx = data.get("index", 0)
            if idx in partial_json:
                raw = partial_json.pop(idx)
                try:
                    blocks.setdefault(idx, {})["input"] = orjson.loads(raw) if raw else {}
                except orjson.JSONDecodeError:
                    blocks.setdefault(idx, {})["input"] = raw
        elif kind == "message_delta" and msg is not None:
            d = data.get("delta") or {}
            for k, v in d.items():
                msg[k] = v
            if data.get("usage"):
                msg["usage"] = {**(msg.get("usage") or {}), **data["usage"]}
    if msg is None:
        return None
    for idx, raw in partial_json.items():  # stream cut before content_block_stop
        blocks.setdefault(idx, {})["input"] = raw
    msg["content"] = msg["content"] + [blocks[i] for i in sorted(blocks)]
    return msg


def extract_tokens(
    dialect: Dialect, obj: Any
) -> tuple[list[int] | None, list[int] | None, list[float] | None, str | None, Any]:
    """``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""
    if not isinstance(obj, dict):
        return None, None, None, None, None
    usage = obj.get("usage")
    if dialect is Dialect.CHAT:
        choices = obj.get("choices") or [{}]
        c0 = choices[0] if isinstance(choices[0], dict) else {}
        lps = None
        content = (c0.get("logprobs") or {}).get("content") if isinstance(c0.get("logprobs"), dict) else None
        if content:
            lps = [float(x.get("logprob", 0.0)) for x in content]
        return obj.get("prompt_token_ids"), c0.get("token_ids"), lps, c0.get("finish_reason"), usage
    if dialect is Dialect.COMPLETIONS:
        choices = obj.get("choices") or [{}]
        c0 = choices[0] if isinstance(choices[0], dict) else {}
        lp = c0.get("logprobs") if isinstance(c0.get("logprobs"), dict) else None
        lps = (
            [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
            if lp and lp.get("token_logprobs")
            else None
        )
        return c0.get("prompt_token_ids"), c0.get("token_ids"), lps, c0.get("finish_reason"), usage
    if dialect is Dialect.RESPONSES:
        return None, None, None, obj.get("status"), usage
    if dialect is Dialect.MESSAGES:
        return None, None, None, obj.get("stop_reason"), usage
    return None, None, None, None, usage
