"""OpenAI (legacy) Completions (``POST /v1/completions``): reassembly and token extraction.

vLLM puts ``prompt_token_ids`` on the choice here (not on the object, as in chat). A stream
ends with ``data: [DONE]`` as chat's does; a raw prompt has no conversation opening.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from orchard_rec.dialects.base import Route, Tokens, WireDialect, assemble_chunks, openapi_post
from orchard_rec.dialects.view import Turn, other, text_block
from orchard_rec.records import Dialect

__all__ = ["DIALECT", "CompletionsRequest", "assemble", "extract_tokens", "injected", "opening"]


class CompletionsRequest(BaseModel):
    """The fields of a completions request we read; the rest pass through untouched."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Any = None
    prompt: Any = None
    stream: bool | None = None
    return_token_ids: Any = None
    logprobs: Any = None


def _new_choice(idx: int) -> dict[str, Any]:
    return {"index": idx, "text": "", "finish_reason": None}


def _add_choice(acc: dict[str, Any], c: dict[str, Any]) -> None:
    acc["text"] += c.get("text") or ""
    if c.get("prompt_token_ids") is not None and "prompt_token_ids" not in acc:
        v = c["prompt_token_ids"]  # a list copied; the writer's immutable ``Ids`` as it is
        acc["prompt_token_ids"] = list(v) if isinstance(v, list) else v
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


def assemble(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    """The completion a non-stream call would have returned, from a stream's parsed chunks."""
    return assemble_chunks(events, "text_completion", _new_choice, _add_choice)


def extract_tokens(obj: Any) -> tuple[Any, Any, list[float] | None, Any, Any]:
    """``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""
    if not isinstance(obj, dict):
        return None, None, None, None, None
    choices = obj.get("choices") or [{}]
    c0 = choices[0] if isinstance(choices[0], dict) else {}
    lp = c0.get("logprobs") if isinstance(c0.get("logprobs"), dict) else None
    lps = (
        [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
        if lp and lp.get("token_logprobs")
        else None
    )
    return c0.get("prompt_token_ids"), c0.get("token_ids"), lps, c0.get("finish_reason"), obj.get("usage")


def opening(body: dict[str, Any]) -> None:
    """A completions prompt is raw text: no conversation opening to derive a session from."""
    return None


def injected(request: Any, upstream: Any) -> tuple[bool, bool]:
    """Which of (ids, logprobs) token mode added to what a completions client asked for
    (``logprobs: 0`` when the client asked for none)."""
    if not isinstance(upstream, dict) or not isinstance(request, dict):
        return False, False
    ids = upstream.get("return_token_ids") is True and not request.get("return_token_ids")
    asked = request.get("logprobs")
    up = upstream.get("logprobs")
    return ids, (asked is None or asked is False) and up == 0 and up is not False


class _Completions(WireDialect):
    name = Dialect.COMPLETIONS
    routes = (Route("POST", r"/v1/completions"),)
    token_native = True
    upstream_path = "/v1/completions"

    def openapi(self) -> dict[str, dict[str, Any]]:
        props = {
            "model": {"type": "string"},
            "prompt": {"type": "string"},
            "stream": {"type": "boolean"},
            "max_tokens": {"type": "integer", "minimum": 1},
        }
        return {"/v1/completions": openapi_post("completions", props, ["model", "prompt"])}

    def token_request(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool, bool]:
        up = dict(body)
        up["return_token_ids"] = True
        inject_lp = body.get("logprobs") is None or body.get("logprobs") is False
        if inject_lp:
            up["logprobs"] = 0  # the sampled token's logprob only
        return up, not body.get("return_token_ids"), inject_lp

    def assemble(self, events: list[tuple[str | None, Any]]) -> Any:
        return assemble(events)

    def extract_tokens(self, obj: Any) -> Tokens:
        return extract_tokens(obj)

    def injected(self, request: Any, upstream: Any) -> tuple[bool, bool]:
        return injected(request, upstream)

    def turns(self, request: dict[str, Any]) -> list[Turn] | None:
        if "prompt" not in request:
            return None
        p = request["prompt"]
        if isinstance(p, str):
            block = text_block(p)
        elif isinstance(p, list):
            block = text_block(f"{len(p)} prompt token ids")
        else:
            block = other(p)
        return [{"role": "prompt", "blocks": [block]}]

    def answer_turn(self, response: dict[str, Any]) -> Turn | None:
        text = _text_of(response)
        return {"role": "assistant", "blocks": [text_block(text)]} if text is not None else None

    def raw_text(self, request: Any, response: Any) -> tuple[str, str] | None:
        prompt = request.get("prompt") if isinstance(request, dict) else None
        text = _text_of(response)
        return (prompt, text) if isinstance(prompt, str) and text is not None else None


def _text_of(response: Any) -> str | None:
    """Choice 0's text."""
    choices = response.get("choices") if isinstance(response, dict) else None
    c0 = choices[0] if isinstance(choices, list) and choices else None
    text = c0.get("text") if isinstance(c0, dict) else None
    return text if isinstance(text, str) else None


DIALECT = _Completions()
"""OpenAI (legacy) Completions, as the registry lists it."""
