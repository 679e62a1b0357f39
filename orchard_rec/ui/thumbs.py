"""Thumbnails of a sample's images for the session page (``orchard-rec ui`` and ``show --html``).

``thumbnails(sample)`` gives one entry per image the sample's tokens show, in order: a small
JPEG as a ``data:`` URL (so ``show --html`` stays one self-contained file), the image's size,
its digest, and its ``[start, end)`` token run when ``metadata.image_spans`` has it. Images
shown by several samples of a page are scaled once (a small cache by digest). An image whose
bytes were not recorded (a remote URL) has no thumbnail: its URL is given as text, never fetched.
"""

from __future__ import annotations

import base64
import io
from collections import OrderedDict
from typing import Any

from orchard_rec.reconstruct import Sample

__all__ = ["THUMB_SIDE", "thumbnails"]

THUMB_SIDE = 160
"""The longest side of a thumbnail, in pixels."""

_CACHE: OrderedDict[str, tuple[str, int, int] | None] = OrderedDict()
_CACHE_SIZE = 256


def _thumb(digest: str, data: bytes) -> tuple[str, int, int] | None:
    if digest in _CACHE:
        _CACHE.move_to_end(digest)
        return _CACHE[digest]
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.thumbnail((THUMB_SIDE, THUMB_SIDE))
            small = im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError):
        found = None
    else:
        buf = io.BytesIO()
        small.save(buf, format="JPEG", quality=80)
        found = ("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode(), *small.size)
    _CACHE[digest] = found
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found


def thumbnails(s: Sample) -> list[dict[str, Any]]:
    spans = s.metadata.get("image_spans") or []
    out = []
    for i, ref in enumerate(s.images):
        thumb = _thumb(ref.digest, ref.data) if ref.data is not None else None
        out.append(
            {
                "digest": ref.digest,
                "src": thumb[0] if thumb else None,
                "tw": thumb[1] if thumb else None,
                "th": thumb[2] if thumb else None,
                "width": ref.width,
                "height": ref.height,
                "url": ref.url,
                "span": spans[i] if i < len(spans) and len(spans) == len(s.images) else None,
            }
        )
    return out
