"""Google Gemini API (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``): to and from chat, its stream, errors, images and opening.

Gemini CLI speaks only this API: in token and tito modes the request becomes a chat completions
request for a token-aware server, and the answer is turned back into a ``GenerateContentResponse``
or its event stream. No I/O here. Wire: https://ai.google.dev/api/generate-content (the
``google-genai`` SDKs, ``@google/genai`` as Gemini CLI bundles it).

Non-obvious bits:
- The model is named in the URL, never in the body; so is the stream (``:streamGenerateContent``).
- The credential is ``x-goog-api-key`` or the ``?key=`` query parameter: both are secrets, the
  recorded path has the key redacted (``secret_params``).
- ``contents`` have roles ``user`` and ``model`` (``function`` from older clients reads as user);
  parts are ``text`` (``thought: true`` marks reasoning), ``functionCall``, ``functionResponse``,
  ``inlineData`` (base64 + ``mimeType``) and ``fileData`` (a URI).
- Calls and results pair by ``id`` when the client sends one (we always put one on the calls we
  answer, so Gemini CLI echoes it); without one they pair by name and order within their turn,
  ``{name}-{k}``, a function of that content alone (so a resent history translates item by item).
- ``functionResponse.response`` is an object: ``{"output": str}`` becomes that text, anything
  else its JSON. Result parts come before the rest of that turn (as tool messages do in chat).
- ``functionDeclarations`` take ``parameters`` (an OpenAPI subset, upper-case ``type`` names)
  or ``parametersJsonSchema``; both become chat ``parameters`` (types lower-cased).
- A stream is unnamed ``data:`` events (``\\r\\n\\r\\n``-framed), each a whole response with the new
  parts; it has no end marker: the event whose candidate has a ``finishReason`` is the last.
  Function calls are never streamed in pieces: they come whole, in the last event.
- Errors are ``{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from orchard_rec.dialects.base import (
    ItemFold,
    Route,
    Tokens,
    WireDialect,
    event_object,
    openapi_post,
    upstream_message,
)
from orchard_rec.dialects.content import first_user, hex_id
from orchard_rec.dialects.images import ImageRef, image_of_url, image_ref
from orchard_rec.dialects.sse import encode
from orchard_rec.errors import BadRequest, OrchardError
from orchard_rec.records import Dialect

__all__ = [
    "DIALECT",
    "GeminiStream",
    "assemble",
    "assistant_message",
    "chat_to_gemini",
    "content_to_chat",
    "error_object",
    "to_chat",
]

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    426: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY"}
_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}


def error_object(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}


def _contents(body: dict[str, Any]) -> list[Any]:
    """The request's ``contents`` when it is a list (anything else reads as none: never trusted
    before ``validate``, as ``opening`` runs on bodies not yet checked)."""
    c = body.get("contents")
    return c if isinstance(c, list) else []


def validate(body: dict[str, Any]) -> None:
    """The checks the real API makes before generating (a 400 in its words, never a proxy error)."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise BadRequest("* GenerateContentRequest.contents: contents is not specified", param="contents")
    for i, c in enumerate(contents):
        if not isinstance(c, dict) or not isinstance(c.get("parts"), list):
            raise BadRequest(f"* GenerateContentRequest.contents[{i}].parts: a list of parts is required")
        if not c["parts"]:
            raise BadRequest(
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("* GenerateContentRequest.tools: must be a list of tool objects", param="tools")
    for key in ("generationConfig", "toolConfig"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise BadRequest(f"* GenerateContentRequest.{key}: must be an object", param=key)


# -- request to chat ----------------------------------------------------------------------------


def _parts_text(value: Any) -> str:
    """The text of a ``Content`` (its parts' texts), a list of parts, or a string."""
    if isinstance(value, str):
        return value
    parts = value.get("parts") if isinstance(value, dict) else value
    if not isinstance(parts, list):
        return ""
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def _pair_ids(parts: Sequence[Any], key: str) -> list[str]:
    """The id of each ``key`` part (``functionCall`` / ``functionResponse``): its own, else ``{name}-{k}``."""
    seen: dict[str, int] = {}
    out = []
    for p in parts:
        fn = p.get(key) if isinstance(p, dict) else None
        if not isinstance(fn, dict):
            continue
        name = str(fn.get("name") or "")
        k = seen[name] = seen.get(name, -1) + 1
        out.append(str(fn["id"]) if fn.get("id") else f"{name}-{k}")
    return out


def _media_part(p: dict[str, Any]) -> dict[str, Any] | None:
    """An ``inlineData`` / ``fileData`` part as a chat content part (images; text documents as text)."""
    inline = p.get("inlineData")
    if isinstance(inline, dict):
        mime = str(inline.get("mimeType") or "application/octet-stream")
        data = inline.get("data") or ""
        if mime.startswith("text/"):
            try:
                return {"type": "text", "text": base64.b64decode(data).decode("utf-8", "replace")}
            except (binascii.Error, ValueError, TypeError):
                return None
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
    file = p.get("fileData")
    if isinstance(file, dict) and file.get("fileUri"):
        return {"type": "image_url", "image_url": {"url": str(file["fileUri"])}}
    return None


def _user_content(parts: list[Any]) -> Any:
    out: list[dict[str, Any]] = []
    for p in parts:
        if not isinstance(p, dict):
            continue
        if isinstance(p.get("text"), str):
            out.append({"type": "text", "text": p["text"]})
        else:
            media = _media_part(p)
            if media is not None:
                out.append(media)
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def _result_text(response: Any) -> str:
    if isinstance(response, dict) and set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    return orjson.dumps(response).decode() if response is not None else ""


def content_to_chat(c: Any) -> list[dict[str, Any]]:
    """The chat messages one ``Content`` becomes: a function of that content alone (so a resent
    history's translation is reused content by content, ``proxy.tochat``)."""
    if not isinstance(c, dict):
        return []
    parts: list[Any] = c["parts"] if isinstance(c.get("parts"), list) else []
    if c.get("role") == "model":
        msg: dict[str, Any] = {"role": "assistant", "content": None}
        texts = [p for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        thoughts = [p["text"] for p in texts if p.get("thought")]
        answer = [p["text"] for p in texts if not p.get("thought")]
        if thoughts:
            msg["reasoning_content"] = "".join(thoughts)
        if answer:
            msg["content"] = "".join(answer)
        ids = iter(_pair_ids(parts, "functionCall"))
        for p in parts:
            fc = p.get("functionCall") if isinstance(p, dict) else None
            if isinstance(fc, dict):
                args = fc.get("args")
                msg.setdefault("tool_calls", []).append(
                    {
                        "id": next(ids),
                        "type": "function",
                        "function": {"name": fc.get("name"), "arguments": orjson.dumps(args or {}).decode()},
                    }
                )
        return [msg]
    out: list[dict[str, Any]] = []
    ids = iter(_pair_ids(parts, "functionResponse"))
    rest = []
    for p in parts:
        fr = p.get("functionResponse") if isinstance(p, dict) else None
        if isinstance(fr, dict):
            out.append(
                {"role": "tool", "tool_call_id": next(ids), "content": _result_text(fr.get("response"))}
            )
        else:
            rest.append(p)
    if rest or not out:
        out.append({"role": "user", "content": _user_content(rest)})
    return out


def system_to_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages ``systemInstruction`` becomes (none or one)."""
    text = _parts_text(body.get("systemInstruction"))
    return [{"role": "system", "content": text}] if text else []


def _schema(s: Any) -> Any:
    """An OpenAPI-subset schema as JSON Schema: ``type`` names lower-cased, recursively."""
    if isinstance(s, list):
        return [_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: _schema(v) for k, v in s.items()}
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
    return out


def chat_request(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request for a Gemini ``body`` whose conversation translated to ``messages``."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = []
    for t in body.get("tools") or ():
        for fd in (t.get("functionDeclarations") or ()) if isinstance(t, dict) else ():
            if not isinstance(fd, dict):
                continue
            params = fd.get("parametersJsonSchema")
            if params is None:
                params = _schema(fd.get("parameters"))
            fn = {"name": fd.get("name"), "parameters": params or {"type": "object", "properties": {}}}
            if fd.get("description"):
                fn["description"] = fd["description"]
            tools.append({"type": "function", "function": fn})
    if tools:
        chat["tools"] = tools
    fcc = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    mode = _MODES.get(str(fcc.get("mode") or "").upper())
    allowed = fcc.get("allowedFunctionNames")
    if mode == "required" and isinstance(allowed, list) and len(allowed) == 1:
        chat["tool_choice"] = {"type": "function", "function": {"name": allowed[0]}}
    elif mode:
        chat["tool_choice"] = mode
    gc = body.get("generationConfig") or {}
    for ours, theirs in (
        ("max_tokens", "maxOutputTokens"),
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("stop", "stopSequences"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if gc.get(theirs) is not None:
            chat[ours] = gc[theirs]
    return chat


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A ``generateContent`` request as a chat completions request (the model is the URL's:
    ``WireDialect.model_of``; the stream is the URL's: ``is_stream``)."""
    messages = system_to_chat(body)
    for c in _contents(body):
        messages += content_to_chat(c)
    return chat_request(body, messages)


# -- chat to the answer -------------------------------------------------------------------------


def _args(arguments: Any) -> Any:
    try:
        v = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def _usage(u: Any) -> dict[str, Any]:
    u = u if isinstance(u, dict) else {}
    p, c = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {
        "promptTokenCount": p,
        "candidatesTokenCount": c,
        "totalTokenCount": int(u.get("total_tokens") or p + c),
    }


def _call_part(tc: dict[str, Any]) -> dict[str, Any]:
    fn = tc.get("function") or {}
    call = {"name": fn.get("name") or "", "args": _args(fn.get("arguments"))}
    if tc.get("id"):
        call = {"id": tc["id"], **call}
    return {"functionCall": call}


def _response(
    parts: list[dict[str, Any]], finish: str | None, usage: Any, model: str | None, rid: str
) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish is not None:
        cand["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [cand]}
    if usage is not None:
        out["usageMetadata"] = usage
    out["modelVersion"] = model
    out["responseId"] = rid
    return out


def chat_to_gemini(chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """A chat completion (non-stream) as a ``GenerateContentResponse``."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        parts.append({"text": reasoning, "thought": True})
    if msg.get("content"):
        parts.append({"text": msg["content"]})
    parts += [_call_part(tc) for tc in msg.get("tool_calls") or ()]
    finish = _FINISH.get(choice.get("finish_reason") or "stop", "STOP")
    return _response(parts, finish, _usage(chat.get("usage")), model or chat.get("model"), hex_id()[:22])


class GeminiStream:
    """Turns chat completion chunks into Gemini's stream: a response per text delta, the function
    calls (whole) with the finish reason and usage in the last one."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.rid = hex_id()[:22]
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.final: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        parts: list[dict[str, Any]] = []
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                continue
            d = c.get("delta") or {}
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                parts.append({"text": r, "thought": True})
            if d.get("content"):
                parts.append({"text": d["content"]})
            for tc in d.get("tool_calls") or ():
                acc = self.calls.setdefault(
                    tc.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}}
                )
                fn = tc.get("function") or {}
                acc["id"] = tc.get("id") or acc["id"]
                acc["function"]["name"] += fn.get("name") or ""
                acc["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
        if not parts:
            return []
        return [(None, _response(parts, None, None, self.model, self.rid))]

    def finish(self) -> list[tuple[str | None, dict[str, Any]]]:
        parts = [_call_part(self.calls[i]) for i in sorted(self.calls)] or [{"text": ""}]
        finish = _FINISH.get(self.finish_reason or "stop", "STOP")
        self.final = _response(parts, finish, _usage(self.usage), self.model, self.rid)
        return [(None, self.final)]

    def error(self, err: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
        return [(None, error_object(500, str(err.get("message", ""))))]


# -- answers ------------------------------------------------------------------------------------


def _candidate(obj: Any) -> dict[str, Any]:
    cands = obj.get("candidates") if isinstance(obj, dict) else None
    c = cands[0] if isinstance(cands, list) and cands and isinstance(cands[0], dict) else {}
    return c


def _parts_of(holder: Any) -> list[Any]:
    """``holder["parts"]`` when ``holder`` is a dict holding a list there, else [] (any JSON is read)."""
    parts = holder.get("parts") if isinstance(holder, dict) else None
    return parts if isinstance(parts, list) else []


def assemble(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    """The response a non-stream call would have returned: the events' parts joined (adjacent
    text of the same kind merged), the last finish reason, usage and ids."""
    out: dict[str, Any] | None = None
    parts: list[dict[str, Any]] = []
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    for _, data in events:
        if not isinstance(data, dict) or ("candidates" not in data and "usageMetadata" not in data):
            continue
        if out is None:
            out = {"candidates": [cand]}
        c = _candidate(data)
        for p in _parts_of(c.get("content")):
            if not isinstance(p, dict):
                continue
            last = parts[-1] if parts else None
            if (
                isinstance(p.get("text"), str)
                and last is not None
                and isinstance(last.get("text"), str)
                and bool(last.get("thought")) == bool(p.get("thought"))
                and set(last) <= {"text", "thought"}
                and set(p) <= {"text", "thought"}
            ):
                last["text"] += p["text"]
            elif p.get("text") != "" or len(p) > 1:
                parts.append(dict(p))
        for k, v in c.items():
            if k not in ("content", "index"):
                cand[k] = v
        for k in ("usageMetadata", "modelVersion", "responseId"):
            if data.get(k) is not None:
                out[k] = data[k]
    return out


def assistant_message(response: Any) -> dict[str, Any] | None:
    """The assistant turn a response represents, as a chat message."""
    if not isinstance(response, dict) or not isinstance(response.get("candidates"), list):
        return None
    return content_to_chat({"role": "model", "parts": _parts_of(_candidate(response).get("content"))})[0]


def _images(request: dict[str, Any]) -> list[ImageRef]:
    out: list[ImageRef] = []
    for c in _contents(request):
        for p in _parts_of(c):
            if not isinstance(p, dict):
                continue
            inline = p.get("inlineData")
            if isinstance(inline, dict) and str(inline.get("mimeType") or "").startswith("image/"):
                try:
                    data = base64.b64decode(inline.get("data") or "", validate=False)
                except (binascii.Error, ValueError, TypeError):
                    continue
                out.append(image_ref(data, inline["mimeType"]))
            file = p.get("fileData")
            if isinstance(file, dict) and str(file.get("mimeType") or "image/").startswith("image/"):
                ref = image_of_url(file.get("fileUri"))
                if ref is not None:
                    out.append(ref)
    return out


class _Gemini(WireDialect):
    name = Dialect("gemini")
    routes = (
        Route(
            "POST", r"/v1(?:beta|alpha)?/models/(?P<model>[^/:]+):(?:streamGenerateContent|generateContent)"
        ),
    )
    conversation_keys = ("contents",)
    secret_headers = frozenset({"x-goog-api-key"})
    secret_params = frozenset({"key"})
    chat_view = True
    end_marks = (b"finishReason",)

    def claims(self, path: str, headers: Mapping[str, str]) -> bool:
        return (
            "x-goog-api-key" in headers
            or "GenerateContent" in path
            or path.startswith(("/v1beta/", "/v1alpha/"))
        )

    def auth_headers(self, key: str, headers: Mapping[str, str]) -> dict[str, str]:
        return {"x-goog-api-key": key}

    def is_stream(self, path: str, body: Any) -> bool:
        return ":streamGenerateContent" in path.partition("?")[0]

    def model_of(self, path: str, body: Any) -> str | None:
        m = self.route("POST", path)
        return m.group("model")[:256] if m is not None else super().model_of(path, body)

    def validate(self, body: dict[str, Any]) -> None:
        validate(body)

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body)

    def fold(self, body: dict[str, Any]) -> ItemFold:
        return ItemFold(content_to_chat, system_to_chat, chat_request)

    def from_chat(self, chat: dict[str, Any], req: dict[str, Any], path: str = "") -> dict[str, Any]:
        return chat_to_gemini(chat, self.model_of(path, req))

    def chat_stream(self, req: dict[str, Any], path: str = "") -> GeminiStream:
        return GeminiStream(self.model_of(path, req))

    def encode_event(self, name: str | None, data: Any) -> bytes:
        return b"data: " + orjson.dumps(data) + b"\r\n\r\n"  # Google frames with CRLF

    def assemble(self, events: list[tuple[str | None, Any]]) -> Any:
        return assemble(events)

    def extract_tokens(self, obj: Any) -> Tokens:
        if not isinstance(obj, dict):
            return None, None, None, None, None
        return None, None, None, _candidate(obj).get("finishReason"), obj.get("usageMetadata")

    def assistant_message(self, response: Any) -> dict[str, Any] | None:
        return assistant_message(response)

    def finish_of(self, response: Any) -> str | None:
        f = _candidate(response).get("finishReason") if isinstance(response, dict) else None
        return f if isinstance(f, str) else None

    def is_terminal(self, name: str | None, data: str) -> bool:
        obj = event_object(data)
        return obj is not None and bool(_candidate(obj).get("finishReason"))

    def error_body(self, exc: OrchardError) -> bytes:
        return orjson.dumps(error_object(exc.status, exc.message))

    def stream_error(self, message: str) -> bytes:
        return encode(None, error_object(500, message))  # what Google's servers send mid-stream

    def upstream_error(self, status: int, data: bytes) -> bytes:
        return orjson.dumps(error_object(status, upstream_message(data)))

    def images(self, request: Any) -> list[ImageRef]:
        return _images(request) if isinstance(request, dict) else []

    def opening(self, body: dict[str, Any]) -> list[Any] | None:
        for c in _contents(body):
            if isinstance(c, dict) and c.get("role", "user") == "user":
                return [_parts_text(body.get("systemInstruction")), c.get("parts")]
        return None

    def instructions(self, body: dict[str, Any]) -> str | None:
        return _parts_text(body.get("systemInstruction")) or None

    def first_user_text(self, body: dict[str, Any]) -> str | None:
        return first_user(body.get("contents"), "parts", role="user")

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        tools = body.get("tools")
        decls = (
            [t.get("functionDeclarations") for t in tools if isinstance(t, dict)]
            if isinstance(tools, list)
            else []
        )
        return [
            fd["name"]
            for fds in decls
            if isinstance(fds, list)
            for fd in fds
            if isinstance(fd, dict) and isinstance(fd.get("name"), str)
        ]

    def openapi(self) -> dict[str, dict[str, Any]]:
        props = {
            "contents": {"type": "array", "items": {"type": "object"}},
            "systemInstruction": {"type": "object"},
            "tools": {"type": "array", "items": {"type": "object"}},
            "generationConfig": {"type": "object"},
        }
        return {
            f"/v1beta/models/{{model}}:{verb}": {
                m: {
                    **op,
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                }
                for m, op in openapi_post(f"gemini_{verb}", props, ["contents"]).items()
            }
            for verb in ("generateContent", "streamGenerateContent")
        }


DIALECT = _Gemini()
"""Google's Gemini API, as the registry lists it."""
