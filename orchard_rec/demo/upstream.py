"""A small vLLM-compatible model server for the demo and the tests.

Speaks vLLM's OpenAI server wire format, including its extensions: ``return_token_ids``
(root ``prompt_token_ids`` and ``choices[i].token_ids``; when streaming, the prompt ids
on the first chunk and per-chunk ``token_ids`` deltas), per-token ``logprobs``,
Hermes-style tool calls parsed into ``tool_calls`` with ``chatcmpl-tool-`` ids, and
``reasoning_content`` from ``<think>`` blocks. ``/v1/responses`` and ``/v1/messages``
(and Gemini's ``/v1beta/models/{model}:generateContent``, by ``demo.gemini``) are answered from
the generation by ``demo.wire``: code of its own, never the proxy's
translations (a translation bug must show in the tests, not be mirrored here). The generated ids
include the end-of-turn token, as vLLM's do.

It keeps ``log``: every request body it received, so tests can check what the proxy
sent upstream.

``vlm=True`` makes it a vision-language server in Qwen2-VL's manner (``demo.vision``): images
(chat ``image_url`` data URLs, Responses ``input_image``, Anthropic ``image`` blocks, tool
results' screenshots) render as ``<|vision_start|><|image_pad|><|vision_end|>`` and each pad is
expanded to the image's token count in ``prompt_token_ids``, as vLLM returns them. vLLM's
token-in endpoint ``/inference/v1/generate`` (``token_ids`` with one pad per image, plus the
images as ``content_parts``) is served too. Without ``vlm`` an image still renders as that
markup, unexpanded (a text model's view).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from orchard_rec.demo.chatml import parse_chatml
from orchard_rec.demo.gemini import gemini_events, gemini_input, gemini_object
from orchard_rec.demo.model import Generation, ScriptedModel, Section
from orchard_rec.demo.scoring import sglang_input_logprobs, vllm_prompt_logprobs
from orchard_rec.demo.tokenizer import IMAGE_PAD
from orchard_rec.demo.vision import ImageError, VisionConfig, expand, image_size
from orchard_rec.demo.wire import (
    message_events,
    message_object,
    messages_input,
    response_events,
    response_object,
    responses_input,
)

__all__ = ["DemoUpstream", "build_upstream_app"]

MODEL_NAME = "orchard-demo"


def _err(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _gemini_err(status: int, message: str) -> web.Response:
    body = {
        "error": {
            "code": status,
            "message": message,
            "status": "INVALID_ARGUMENT" if status == 400 else "NOT_FOUND",
        }
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def _tool_call_deltas(
    s: Section, call: dict[str, Any], tool_index: int
) -> list[tuple[dict[str, Any], list[int], int]]:
    """A tool call section as chat deltas ``(delta, token ids, positions advanced)``: the call's
    head with the first half of its ids, then its arguments in up to three pieces."""
    half = max(1, len(s.ids) // 2)
    tid = "chatcmpl-tool-" + uuid.uuid4().hex[:16]
    head = {
        "index": tool_index,
        "id": tid,
        "type": "function",
        "function": {"name": call["name"], "arguments": ""},
    }
    out: list[tuple[dict[str, Any], list[int], int]] = [({"tool_calls": [head]}, s.ids[:half], half)]
    rest = s.ids[half:]
    args = call["arguments"]
    pieces = min(3, max(1, len(rest)))
    step = -(-len(args) // pieces) if args else 1
    arg_parts = [args[i : i + step] for i in range(0, len(args), step)] or [""]
    id_parts = [
        rest[i * len(rest) // len(arg_parts) : (i + 1) * len(rest) // len(arg_parts)]
        for i in range(len(arg_parts))
    ]
    for a, ids in zip(arg_parts, id_parts):
        out.append(({"tool_calls": [{"index": tool_index, "function": {"arguments": a}}]}, ids, len(ids)))
    return out


class DemoUpstream:
    def __init__(
        self,
        *,
        drift: bool = False,
        think: bool = False,
        preamble: bool = False,
        chunk_delay: float = 0.0,
        stream_interval: int = 1,
        model_name: str = MODEL_NAME,
        vlm: bool = False,
        vision: VisionConfig | None = None,
    ) -> None:
        self.model = ScriptedModel(drift=drift, think=think, preamble=preamble)
        self.vlm = vlm
        """Expand image placeholders as Qwen2-VL's processor does (``demo.vision``)."""
        self.vision = vision or VisionConfig()
        self.image_pad = self.model._special(IMAGE_PAD)
        self.chunk_delay = chunk_delay
        self.stream_interval = max(1, stream_interval)
        """Tokens per streamed delta (vLLM's ``--stream-interval``): 1 streams every token on its own."""
        self.model_name = model_name
        self.log: list[tuple[str, Any]] = []
        """Every request body received, with its path."""
        self.sent: list[bytes] = []
        """Every response body, in order (streams: all frames joined, logged as the stream starts)."""
        self.aborted = 0
        """Streams the client (the proxy) hung up on before the end."""
        self.headers: list[dict[str, str]] = []
        """The request headers (names lower-cased) of every body in ``log``, in the same order."""
        self.weight_version = "default"
        """vLLM's weight label (``VLLM_SERVER_DEV_MODE=1``: ``GET /weight_info``,
        ``POST /update_weight_version``); ``/inference/v1/generate`` reports it as ``weight_versions``."""
        self.abort_next: tuple[int, str] | None = None
        """``(n, version)``: the next ``/inference/v1/generate`` is aborted after ``n`` tokens, as
        ``/pause?mode=abort`` would, and the weights are then labelled ``version`` (a test's update)."""

    # -- helpers ------------------------------------------------------------------------------

    def _logprobs_content(self, ids: list[int], start: int) -> list[dict[str, Any]]:
        out = []
        for k, i in enumerate(ids):
            tok = self.model.decode([i])
            out.append(
                {
                    "token": tok,
                    "logprob": self.model.logprob(start + k, i),
                    "bytes": list(tok.encode()),
                    "top_logprobs": [],
                }
            )
        return out

    def _message(self, gen: Generation) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": gen.content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        calls = gen.tool_calls
        msg["tool_calls"] = [
            {
                "id": "chatcmpl-tool-" + uuid.uuid4().hex[:16],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls
        ]
        if gen.reasoning is not None:
            msg["reasoning_content"] = gen.reasoning
        return msg

    @staticmethod
    def _usage(gen: Generation) -> dict[str, Any]:
        n = len(gen.ids)
        return {
            "prompt_tokens": len(gen.prompt_ids),
            "total_tokens": len(gen.prompt_ids) + n,
            "completion_tokens": n,
            "prompt_tokens_details": None,
        }

    def _generate(self, body: dict[str, Any]) -> Generation:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        messages = body.get("messages") or []
        return self._see(self.model.generate(messages, body.get("tools"), max_tokens=max_tokens), messages)

    # -- vision ----------------------------------------------------------------------------------

    def image_tokens(self, url: str) -> int:
        """How many pads the image at ``url`` (a base64 ``data:`` URL) becomes."""
        data = _data_url(url)
        w, h = image_size(data)
        return self.vision.tokens(w, h)

    def _see(self, gen: Generation, messages: list[dict[str, Any]]) -> Generation:
        """In VLM mode, expand the prompt's image placeholders (one per image, in order)."""
        if self.vlm:
            urls = _chat_image_urls(messages)
            if urls:
                gen.prompt_ids, _ = expand(
                    gen.prompt_ids, self.image_pad, [self.image_tokens(u) for u in urls]
                )
        return gen

    # -- chat -----------------------------------------------------------------------------------

    def chat_object(self, body: dict[str, Any], gen: Generation) -> dict[str, Any]:
        ids = gen.ids
        choice: dict[str, Any] = {
            "index": 0,
            "message": self._message(gen),
            "logprobs": {"content": self._logprobs_content(ids, 0)} if body.get("logprobs") else None,
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
        }
        choice["token_ids"] = ids if body.get("return_token_ids") else None
        out: dict[str, Any] = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self._usage(gen),
            "prompt_logprobs": None,
            "prompt_token_ids": gen.prompt_ids if body.get("return_token_ids") else None,
            "kv_transfer_params": None,
        }
        return out

    def chat_chunks(self, body: dict[str, Any], gen: Generation) -> list[dict[str, Any]]:
        """The chunks vLLM would stream for this generation (one token per chunk)."""
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        model = body.get("model") or self.model_name
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        opts = body.get("stream_options") or {}

        def chunk(
            delta: dict[str, Any], ids: list[int], pos: int, finish: str | None = None
        ) -> dict[str, Any]:
            c: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": self._logprobs_content(ids, pos)} if want_lp and ids else None,
                "finish_reason": finish,
            }
            if finish is not None:
                c["stop_reason"] = None
            c["token_ids"] = ids if want_ids else None
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [c],
            }

        first = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        first["prompt_token_ids"] = gen.prompt_ids if want_ids else None
        out = [first]
        pos = 0
        tool_index = 0
        for s in gen.sections:
            if s.kind == "eos":
                continue
            if s.kind == "tool_call" and s.call is not None:
                for delta, ids, advance in _tool_call_deltas(s, s.call, tool_index):
                    out.append(chunk(delta, ids, pos))
                    pos += advance
                tool_index += 1
                continue
            key = "reasoning_content" if s.kind == "reasoning" else "content"
            prev = ""
            step = 1 if not s.text else self.stream_interval
            for k in range(0, len(s.ids), step):
                ids_k = s.ids[k : k + step]
                if not s.text:  # tag tokens: ids only, as vLLM sends for control tokens with return_token_ids
                    out.append(chunk({}, ids_k, pos))
                    pos += len(ids_k)
                    continue
                now = self.model.decode(s.ids[: k + step])
                piece = now[len(prev) :]
                prev = now
                out.append(chunk({key: piece} if piece else {}, ids_k, pos))
                pos += len(ids_k)
        eos = [i for s in gen.sections if s.kind == "eos" for i in s.ids]
        out.append(chunk({"content": ""} if eos else {}, eos, pos, gen.finish_reason))
        if opts.get("include_usage"):
            out.append(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": self._usage(gen),
                }
            )
        return out

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("messages"), list):
            return _err(400, "messages: field required (a list)")
        gen = self._generate(body)
        if not body.get("stream"):
            return self._json(self.chat_object(body, gen))
        return await self._stream(request, (_sse(c) for c in self.chat_chunks(body, gen)), done=True)

    # -- completions ---------------------------------------------------------------------------

    def _prompt_logprobs(self, prompt_ids: list[int], k: Any) -> list[Any] | None:
        """vLLM's ``prompt_logprobs`` (a teacher scoring a sequence), deterministic here."""
        if k is None or isinstance(k, bool) or not isinstance(k, int) or k < 0:
            return None
        return vllm_prompt_logprobs(
            prompt_ids, k, self.model.tok.get_vocab_size(), lambda t: self.model.tok.decode(t)
        )

    def _prompt_ids(self, prompt: Any) -> list[int] | None:
        """A completions ``prompt`` (text or ids, or a batch of one) as token ids; None if neither."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.model.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            return list(prompt)
        return None

    def _complete(self, body: dict[str, Any], prompt_ids: list[int]) -> tuple[list[int], str]:
        """The completion's ids and finish reason: a chat rendered by the client (token-in/token-out)
        is answered as the chat; any other prompt with a fixed answer."""
        prompt_text = self.model.decode(prompt_ids)
        if prompt_text.endswith("<|im_start|>assistant\n"):
            messages, tools = parse_chatml(prompt_text)
            gen = self.model.generate(
                messages, tools, max_tokens=body.get("max_tokens"), prompt_ids=prompt_ids
            )
            return gen.ids, ("length" if gen.finish_reason == "length" else "stop")
        text = " The answer is 42."
        ids = self.model._noncanonical(self.model.encode(text)) + [self.model.eos]
        finish = "stop"
        max_tokens = body.get("max_tokens") or 16
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        return ids, finish

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt_ids = self._prompt_ids(body.get("prompt"))
        if prompt_ids is None:
            return _err(400, "prompt: expected a string or a list of token ids")
        ids, finish = self._complete(body, prompt_ids)
        want_lp = body.get("logprobs") is not None and body.get("logprobs") is not False
        want_ids = bool(body.get("return_token_ids"))
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        model = body.get("model") or self.model_name

        def lp(ids_: list[int], pos: int) -> dict[str, Any] | None:
            if not want_lp:
                return None
            toks = [self.model.decode([i]) for i in ids_]
            return {
                "text_offset": list(range(pos, pos + len(ids_))),
                "token_logprobs": [self.model.logprob(pos + k, i) for k, i in enumerate(ids_)],
                "tokens": toks,
                "top_logprobs": [
                    {t: self.model.logprob(pos + k, i)} for k, (t, i) in enumerate(zip(toks, ids_))
                ],
            }

        usage = {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + len(ids),
            "completion_tokens": len(ids),
            "prompt_tokens_details": None,
        }
        # like vLLM: the stop token's text is left out, special tokens kept when asked
        skip = body.get("skip_special_tokens", True) is not False
        shown = ids[:-1] if finish == "stop" and ids and ids[-1] == self.model.eos else ids
        if not body.get("stream"):
            choice: dict[str, Any] = {
                "index": 0,
                "text": self.model.tok.decode(shown, skip_special_tokens=skip),
                "logprobs": lp(ids, 0),
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_logprobs": self._prompt_logprobs(prompt_ids, body.get("prompt_logprobs")),
                "prompt_token_ids": prompt_ids if want_ids else None,
                "token_ids": ids if want_ids else None,
            }
            obj = {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "kv_transfer_params": None,
            }
            return self._json(obj)
        chunks = []
        prev = ""
        step = self.stream_interval
        for k in range(0, len(ids), step):
            ids_k = ids[k : k + step]
            now = self.model.tok.decode(shown[: k + step], skip_special_tokens=skip)
            c: dict[str, Any] = {
                "index": 0,
                "text": now[len(prev) :],
                "logprobs": lp(ids_k, k),
                "finish_reason": finish if k + step >= len(ids) else None,
                "stop_reason": None,
            }
            prev = now
            if k == 0:
                c["prompt_token_ids"] = prompt_ids if want_ids else None
            c["token_ids"] = ids_k if want_ids else None
            chunks.append(
                {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [c]}
            )
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        return await self._stream(request, (_sse(c) for c in chunks), done=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native ``/generate`` with ``input_ids`` (non-stream)."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        ids_in = body.get("input_ids")
        if not isinstance(ids_in, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids_in
        ):
            return _err(400, "input_ids: a list of token ids is required")
        params = body.get("sampling_params") or {}
        if params.get("max_new_tokens") == 0:  # scoring only (a teacher's input log-probs)
            ids: list[int] = []
            finish_type = "length"
        else:
            messages, tools = parse_chatml(self.model.decode(ids_in))
            gen = self.model.generate(
                messages, tools, max_tokens=params.get("max_new_tokens"), prompt_ids=ids_in
            )
            ids = gen.ids
            finish_type = "length" if gen.finish_reason == "length" else "stop"
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": finish_type},
            "prompt_tokens": len(ids_in),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,  # SGLang labels every answer (slime reads it)
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[self.model.logprob(k, i), i, None] for k, i in enumerate(ids)]
            start = body.get("logprob_start_len")
            if isinstance(start, int) and start >= 0 and ids_in:
                k = int(body.get("top_logprobs_num") or 0)
                toks, tops = sglang_input_logprobs(ids_in, start, k, self.model.tok.get_vocab_size())
                meta["input_token_logprobs"] = toks
                if k:
                    meta["input_top_logprobs"] = tops
        skip = params.get("skip_special_tokens", True) is not False
        shown = ids[:-1] if ids and ids[-1] == self.model.eos else ids
        text = self.model.tok.decode(shown, skip_special_tokens=skip)
        return self._json({"text": text, "output_ids": ids, "meta_info": meta})

    async def inference_generate(self, request: web.Request) -> web.StreamResponse:
        """vLLM's token-in endpoint ``POST /inference/v1/generate`` (served by ``vllm serve
        --enable-scale-out``): ``token_ids`` with one ``<|image_pad|>`` per image and the images as
        ``content_parts`` (``{"type": "image_url", "url": ...}``); the server expands the pads
        (``prompt_token_ids`` with ``return_token_ids``, and ``mm_placeholders``). Non-stream."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        ids_in = body.get("token_ids")
        if (
            not isinstance(ids_in, list)
            or not ids_in
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids_in)
        ):
            return _err(400, "token_ids: a non-empty list of token ids is required")
        params = body.get("sampling_params")
        if not isinstance(params, dict):
            return _err(400, "sampling_params: field required")
        if body.get("stream"):
            return _err(400, "the demo server answers /inference/v1/generate without streaming")
        parts = body.get("content_parts") or []
        urls = [str(p.get("url")) for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
        if urls and not self.vlm:
            return _err(400, "the demo model is text-only (start it with --vlm for images)")
        prompt_ids = list(ids_in)
        runs: list[tuple[int, int]] = []
        if urls:
            prompt_ids, runs = expand(ids_in, self.image_pad, [self.image_tokens(u) for u in urls])
        messages, tools = parse_chatml(self.model.decode(ids_in))
        gen = self.model.generate(messages, tools, max_tokens=params.get("max_tokens"), prompt_ids=prompt_ids)
        ids, finish = gen.ids, "length" if gen.finish_reason == "length" else "stop"
        if self.abort_next is not None:
            (n, after), self.abort_next = self.abort_next, None
            ids, finish = ids[:n], "abort"
        spans = [{"version": self.weight_version, "start": 0, "end": len(ids)}] if ids else []
        if finish == "abort":
            self.weight_version = after
        want_ids = bool(body.get("return_token_ids"))
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": ids,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": spans,
            "logprobs": {
                "content": [
                    {"token_id": i, "logprob": self.model.logprob(k, i), "rank": None, "top_logprobs": []}
                    for k, i in enumerate(ids)
                ]
            }
            if params.get("logprobs") is not None
            else None,
        }
        mode = body.get("output_mode") or "tokens"
        if mode == "text":
            skip = params.get("skip_special_tokens", True) is not False
            shown = ids[:-1] if ids and ids[-1] == self.model.eos else ids
            choice["text"] = self.model.tok.decode(shown, skip_special_tokens=skip)
        obj = {
            "request_id": body.get("request_id") or uuid.uuid4().hex,
            "model": body.get("model") or self.model_name,
            "created": int(time.time()),
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + len(ids),
                "completion_tokens": len(ids),
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": prompt_ids if want_ids else None,
            "mm_placeholders": {"image": [{"offset": o, "length": n} for o, n in runs]}
            if want_ids and runs
            else None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": mode,
            "choices": [choice],
        }
        return self._json(obj)

    # -- Responses and Messages (built from the generation by ``demo.wire``, not the proxy's code) --

    def _pieces(self, s: Section) -> list[str]:
        """A section's text as streamed, one piece per ``stream_interval`` tokens (empty pieces dropped)."""
        out, prev = [], ""
        for k in range(0, len(s.ids), self.stream_interval):
            now = self.model.decode(s.ids[: k + self.stream_interval])
            if len(now) > len(prev):
                out.append(now[len(prev) :])
            prev = now
        return out

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if body.get("input") is None:
            return _err(400, "input: field required")
        messages, tools, custom, max_tokens = responses_input(body)
        gen = self._see(self.model.generate(messages, tools or None, max_tokens=max_tokens), messages)
        if not body.get("stream"):
            return self._json(response_object(body, gen, custom, self.model_name))
        events = response_events(body, gen, custom, self.model_name, self._pieces)
        return await self._stream(request, (_sse(d, name) for name, d in events), done=False)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("messages"), list) or body.get("max_tokens") is None:
            body_err = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "messages and max_tokens are required"},
            }
            return web.Response(status=400, body=orjson.dumps(body_err), content_type="application/json")
        messages, tools, max_tokens = messages_input(body)
        gen = self._see(self.model.generate(messages, tools or None, max_tokens=max_tokens), messages)
        if not body.get("stream"):
            return self._json(message_object(body, gen, self.model_name))
        events = message_events(body, gen, self.model_name, self._pieces)
        return await self._stream(request, (_sse(d, name) for name, d in events), done=False)

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        """Google's ``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (``demo.gemini``)."""
        model, _, verb = request.match_info["call"].partition(":")
        if verb not in ("generateContent", "streamGenerateContent"):
            return _gemini_err(404, f"method {verb!r} is not served here")
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("contents"), list) or not body["contents"]:
            return _gemini_err(400, "* GenerateContentRequest.contents: contents is not specified")
        if not all(isinstance(c, dict) and c.get("parts") for c in body["contents"]):
            return _gemini_err(
                400, "* GenerateContentRequest.contents.parts: contents.parts must not be empty."
            )
        messages, tools, max_tokens = gemini_input(body)
        gen = self._see(self.model.generate(messages, tools or None, max_tokens=max_tokens), messages)
        if verb == "generateContent":
            return self._json(gemini_object(gen, model))
        frames = (b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in gemini_events(gen, model, self._pieces))
        return await self._stream(request, frames, done=False)

    async def models(self, request: web.Request) -> web.Response:
        obj = {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": self.model_name,
                    "parent": None,
                    "max_model_len": 32768,
                    "permission": [],
                }
            ],
        }
        return self._json(obj)

    # -- plumbing --------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _err(400, f"invalid JSON: {exc}")
        if not isinstance(body, dict):
            return _err(400, "body must be an object")
        self.log.append((request.path, body))
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        return body

    def _json(self, obj: Any) -> web.Response:
        data = orjson.dumps(obj)
        self.sent.append(data)
        return web.Response(body=data, content_type="application/json")

    async def _stream(self, request: web.Request, frames: Any, done: bool) -> web.StreamResponse:
        frames = list(frames) + ([b"data: [DONE]\n\n"] if done else [])
        self.sent.append(b"".join(frames))  # logged before sending, so a test never races the handler
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            for f in frames:
                await resp.write(f)
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.aborted += 1
            raise
        return resp

    def app(self) -> web.Application:
        @web.middleware
        async def invalid(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                return await handler(request)
            except web.HTTPException:
                raise
            except (
                TypeError,
                AttributeError,
                KeyError,
                ValueError,
                IndexError,
            ) as exc:  # vLLM's pydantic says 400
                return _err(400, f"invalid request: {type(exc).__name__}: {exc}")

        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[invalid])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1beta/models/{call}", self.gemini)
        app.router.add_post(
            "/v1/models/{call}", self.gemini
        )  # the API's stable version (newer SDKs' default)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/inference/v1/generate", self.inference_generate)
        app.router.add_get("/health", _health)  # vLLM's liveness route: 200, empty
        app.router.add_get("/weight_info", self.weight_info)
        app.router.add_post("/update_weight_version", self.update_weight_version)
        return app

    async def weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})  # not logged: polled

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        self.weight_version = str(body["new_version"])
        return web.json_response({"success": True, "new_version": self.weight_version})


def _chat_image_urls(messages: list[dict[str, Any]]) -> list[str]:
    """The image URLs of chat messages in the order the template renders them."""
    out: list[str] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        for p in content if isinstance(content, list) else ():
            if not isinstance(p, dict):
                continue
            if p.get("type") == "image_url" or p.get("type") == "input_image":
                u = p.get("image_url")
                out.append(str(u.get("url") if isinstance(u, dict) else u))
    return out


def _data_url(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; ``ImageError`` otherwise (this server is offline)."""
    head, sep, payload = url.partition(",")
    if not url.startswith("data:") or not sep or not head.endswith(";base64"):
        raise ImageError(
            f"cannot load image {url[:60]!r}: only base64 data: URLs (the demo server is offline)"
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("invalid base64 in an image data: URL") from None


async def _health(_request: web.Request) -> web.Response:
    return web.Response()


def build_upstream_app(**kwargs: Any) -> web.Application:
    return DemoUpstream(**kwargs).app()
