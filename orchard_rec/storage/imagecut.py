"""Images in stored text, under ``storage/layout.py`` (which re-exports them): where each base64
payload sits in a piece of request JSON, the exact-re-encoding check, and the text cut at those
spans (offset, SHA-256 holes) and pasted back. Moved out of ``storage/layout.py``.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = [
    "IMAGE_MIN",
    "b64_exact",
    "cut",
    "image_spans",
    "pack_holes",
    "paste",
    "unpack_holes",
]

IMAGE_MIN = 64
"""Base64 payloads shorter than this (characters) stay literal text."""


# -- images --------------------------------------------------------------------------------------


def _image_payloads(v: Any, out: list[tuple[str, str | None]]) -> None:
    """Base64 image payloads (with media type) in a parsed JSON value, in document order."""
    if isinstance(v, dict):
        t = v.get("type")
        if t == "image_url" or t == "input_image":
            u = v.get("image_url")
            if isinstance(u, dict):
                u = u.get("url")
            elif u is None:  # vLLM's content parts: {"type": "image_url", "url": ...}
                u = v.get("url")
            if isinstance(u, str) and u.startswith("data:"):
                head, sep, payload = u.partition(",")
                if sep and head.endswith(";base64"):
                    out.append((payload, head[5:].split(";", 1)[0] or None))
        elif t == "image":
            src = v.get("source")
            if isinstance(src, dict) and src.get("type") == "base64" and isinstance(src.get("data"), str):
                mt = src.get("media_type")
                out.append((src["data"], mt if isinstance(mt, str) else None))
        for x in v.values():
            if isinstance(x, (dict, list)):
                _image_payloads(x, out)
    elif isinstance(v, list):
        for x in v:
            if isinstance(x, (dict, list)):
                _image_payloads(x, out)


def image_spans(piece: str) -> list[tuple[int, int, str | None]]:
    """``(start, end, media type)`` of each image's base64 in ``piece`` (the text of one JSON value).

    Only where the JSON string holds the base64 verbatim (no escapes) and it is at least
    ``IMAGE_MIN`` characters; whether it re-encodes exactly is checked by ``b64_exact``.
    """
    if "base64" not in piece:
        return []
    try:
        value = orjson.loads(piece)
    except orjson.JSONDecodeError:
        return []
    found: list[tuple[str, str | None]] = []
    _image_payloads(value, found)
    spans: list[tuple[int, int, str | None]] = []
    pos = 0
    for payload, mime in found:
        if len(payload) < IMAGE_MIN:
            continue
        at = piece.find(payload, pos)
        if at < 0:
            continue
        end = at + len(payload)
        if piece[at - 1 : at] not in (",", '"') or piece[end : end + 1] != '"':
            continue
        spans.append((at, end, mime))
        pos = end
    return spans


def b64_exact(payload: str) -> bytes | None:
    """The bytes of ``payload`` when standard base64 of them is exactly ``payload``; else None."""
    try:
        raw = payload.encode("ascii")
        data = binascii.a2b_base64(raw)  # lenient; the re-encoding below is the strict check
    except (binascii.Error, ValueError):
        return None
    return data if binascii.b2a_base64(data, newline=False) == raw else None


_HOLE = struct.Struct("<I32s")


def pack_holes(holes: Sequence[tuple[int, bytes]]) -> bytes:
    """``(offset in the cut text, SHA-256)`` per image, 36 bytes each."""
    return b"".join(_HOLE.pack(o, h) for o, h in holes)


def unpack_holes(data: bytes) -> list[tuple[int, bytes]]:
    return [_HOLE.unpack_from(data, i) for i in range(0, len(data), _HOLE.size)]


def cut(text: str, spans: Sequence[tuple[int, int, bytes]]) -> tuple[str, list[tuple[int, bytes]]]:
    """``text`` without the ``(start, end, sha256)`` spans (in order), and where each was."""
    parts: list[str] = []
    holes: list[tuple[int, bytes]] = []
    cur = size = 0
    for start, end, h in spans:
        parts.append(text[cur:start])
        size += start - cur
        holes.append((size, h))
        cur = end
    parts.append(text[cur:])
    return "".join(parts), holes


def paste(text: str, holes: Sequence[tuple[int, bytes]], b64: dict[bytes, str]) -> str:
    """``cut`` undone: each hole filled with its image's base64 text."""
    parts: list[str] = []
    cur = 0
    for off, h in holes:
        parts.append(text[cur:off])
        parts.append(b64[h])
        cur = off
    parts.append(text[cur:])
    return "".join(parts)
