"""Images in requests: where each dialect puts them, in the order a chat template renders them.

A screenshot reaches the model as a chat ``image_url`` part (a ``data:`` URL or a remote URL),
a Responses ``input_image`` (``image_url``: a data URL or URL; ``file_id``), or an Anthropic
``image`` block (``source``: ``base64`` + ``media_type``, or ``url``), also nested in a
``tool_result`` block's content (computer-use screenshots) and, for chat and Responses, in a
tool output's content list. Each dialect lists them (``orchard_rec.dialects.images_of``) in prompt order (messages in
order, parts in order, a tool result's parts where the result sits), which is the order a
vision-language chat template emits its image placeholders and so the order of the image
runs in the prompt ids.

``ImageRef`` identifies an image by the SHA-256 of its decoded bytes (``digest``): the key
storage keeps an image under once, the name exporters write it by, and what a sample lists.
Remote URLs (never fetched) have no digest of bytes: their ``digest`` is the SHA-256 of the
URL text and ``url`` holds it. Dimensions come from the image header (Pillow) when it is installed
and the bytes are a format it knows; otherwise None.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "IMAGE_TOKENS",
    "ImageRef",
    "anthropic_images",
    "chat_images",
    "decode_data_url",
    "image_of_url",
    "image_ref",
    "image_token_id",
    "responses_images",
]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a prompt: content-addressed, with the bytes when the request carried them."""

    digest: str
    """SHA-256 (hex) of the decoded bytes; of the URL text for a remote image."""
    mime: str | None = None
    """``image/png`` ...: the data URL's / block's media type (None for a remote URL)."""
    width: int | None = None
    height: int | None = None
    url: str | None = None
    """The remote URL for an image the request referred to by address (not fetched); else None."""
    data: bytes | None = field(default=None, compare=False, repr=False)
    """The image bytes (decoded from the request); None for remote images and refs read back from files."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "digest": self.digest,
            "mime": self.mime,
            "width": self.width,
            "height": self.height,
        }
        if self.url is not None:
            d["url"] = self.url
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImageRef:
        return cls(str(d["digest"]), d.get("mime"), d.get("width"), d.get("height"), d.get("url"))

    @property
    def extension(self) -> str:
        """A file extension for the media type (``png``, ``jpg`` ...; ``bin`` when unknown)."""
        sub = (self.mime or "").partition("/")[2].lower()
        return {"jpeg": "jpg", "svg+xml": "svg"}.get(sub, sub) or "bin"


IMAGE_TOKENS = ("<|image_pad|>", "<image>", "<|image|>", "<image_soft_token>", "<|IMAGE|>")
"""Image placeholder tokens of common VLM families (Qwen2/2.5/3-VL first)."""


def image_token_id(tokenizer: Any) -> int | None:
    """The id of the tokenizer's image placeholder token, or None when it has none."""
    if tokenizer is None:
        return None
    explicit = getattr(tokenizer, "image_token_id", None)
    if isinstance(explicit, int):
        return explicit
    vocab: dict[str, int] = {}
    try:
        vocab = dict(tokenizer.get_vocab())
    except (AttributeError, TypeError):
        return None
    for name in IMAGE_TOKENS:
        if name in vocab:
            return int(vocab[name])
    return None


def decode_data_url(url: str) -> tuple[str, bytes] | None:
    """``(media type, bytes)`` of a base64 ``data:`` URL; None for anything else (or bad base64)."""
    if not url.startswith("data:"):
        return None
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    mime = head[5:].split(";", 1)[0] or "application/octet-stream"
    try:
        return mime, base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError):
        return None


_PNG = b"\x89PNG\r\n\x1a\n"


def _dims(data: bytes) -> tuple[int | None, int | None]:
    if data[:8] == _PNG and data[12:16] == b"IHDR" and len(data) >= 24:  # the header, without Pillow
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        return None, None
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            return int(w), int(h)
    except (UnidentifiedImageError, OSError, ValueError):
        return None, None


def image_ref(data: bytes, mime: str | None) -> ImageRef:
    """The reference of image bytes (digest, media type, dimensions), carrying the bytes."""
    w, h = _dims(data)
    return ImageRef(hashlib.sha256(data).hexdigest(), mime, w, h, None, data)


def image_of_url(url: Any) -> ImageRef | None:
    if not isinstance(url, str) or not url:
        return None
    decoded = decode_data_url(url)
    if decoded is not None:
        return image_ref(decoded[1], decoded[0])
    return ImageRef(hashlib.sha256(url.encode()).hexdigest(), None, None, None, url)


def _chat_parts(content: Any) -> Iterator[ImageRef]:
    if not isinstance(content, list):
        return
    for p in content:
        if not isinstance(p, dict):
            continue
        t = p.get("type")
        if t == "image_url":
            u = p.get("image_url")
            ref = image_of_url(u.get("url") if isinstance(u, dict) else u)
            if ref is not None:
                yield ref
        elif t == "input_image":  # Responses-style parts some clients also send to chat
            ref = image_of_url(p.get("image_url"))
            if ref is not None:
                yield ref


def _responses_parts(content: Any) -> Iterator[ImageRef]:
    if not isinstance(content, list):
        return
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") == "input_image":
            url = p.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            ref = image_of_url(url)
            if ref is None and isinstance(p.get("file_id"), str):
                fid = p["file_id"]
                ref = ImageRef(hashlib.sha256(fid.encode()).hexdigest(), None, None, None, f"file:{fid}")
            if ref is not None:
                yield ref
        elif p.get("type") == "image_url":
            yield from _chat_parts([p])


def _anthropic_blocks(content: Any) -> Iterator[ImageRef]:
    if not isinstance(content, list):
        return
    for b in content:
        if not isinstance(b, dict):
            continue
        t = b.get("type")
        if t == "image":
            src = b.get("source") or {}
            if src.get("type") == "base64" and isinstance(src.get("data"), str):
                try:
                    data = base64.b64decode(src["data"], validate=False)
                except (binascii.Error, ValueError):
                    continue
                yield image_ref(data, src.get("media_type"))
            elif src.get("type") == "url":
                ref = image_of_url(src.get("url"))
                if ref is not None:
                    yield ref
        elif t == "tool_result":
            yield from _anthropic_blocks(b.get("content"))


def chat_images(request: dict[str, Any]) -> list[ImageRef]:
    """A chat request's images, in prompt order."""
    out: list[ImageRef] = []
    for m in request.get("messages") or ():
        if isinstance(m, dict):
            out.extend(_chat_parts(m.get("content")))
    return out


def responses_images(request: dict[str, Any]) -> list[ImageRef]:
    """A Responses request's images, in prompt order (tool outputs' where they sit)."""
    out: list[ImageRef] = []
    items = request.get("input")
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            out.extend(_responses_parts(item.get("output")))
        else:
            out.extend(_responses_parts(item.get("content")))
    return out


def anthropic_images(request: dict[str, Any]) -> list[ImageRef]:
    """A Messages request's images, in prompt order (tool results' where they sit)."""
    out: list[ImageRef] = []
    for m in request.get("messages") or ():
        if isinstance(m, dict):
            out.extend(_anthropic_blocks(m.get("content")))
    return out
