"""A sample's images as each format writes them: files named by digest, PIL images, HF ``Image`` cells.

``Sample.images`` lists the images the sample's tokens show, in order, each an ``ImageRef``
whose ``data`` holds the bytes the recorded request carried. Formats write them as:

- ``ImageSidecar`` (jsonl): one file per distinct image, ``<digest>.<ext>`` in a folder next to
  the output, written once (an existing file is the same image: the name is its SHA-256);
  each row's image refs gain ``path`` relative to the output's folder.
- ``hf_image_cells`` (parquet, verl, trl): ``{"bytes", "path"}`` structs, the storage of a
  Hugging Face ``datasets.Image`` feature (``columnar.IMAGES_FIELD``).
- ``pil_images`` (slime, and anything that hands images to a processor): decoded
  ``PIL.Image`` objects, converted to RGB as Orchard's GUI generator does.

A remote image (a URL the client sent, never fetched) has no bytes: HF cells carry its URL as
``path`` and no bytes, the sidecar has no file for it, and ``pil_images`` refuses it (a trainer
would have nothing to show the model). Pure: no pyarrow, no torch (the jsonl formats use it).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import current_output_set
from orchard_rec.protocol.images import ImageRef
from orchard_rec.reconstruct import Sample

__all__ = ["ImageSidecar", "hf_image_cells", "pil_images", "sidecar_folder", "warn_images_dropped"]

log = logging.getLogger(__name__)


def _missing(s: Sample, ref: ImageRef) -> ExportError:
    what = (
        f"the remote image {ref.url}"
        if ref.url
        else f"image {ref.digest[:12]}, whose bytes were not recorded"
    )
    return ExportError(
        f"sample {s.index} of session {s.session_id} shows {what}; orchard-rec never fetches images, "
        "so this format cannot carry it (jsonl and parquet keep the reference)"
    )


def pil_images(s: Sample) -> list[Any]:
    """The sample's images as RGB ``PIL.Image`` objects, in order (pixels loaded, file closed)."""
    from PIL import Image

    out = []
    for ref in s.images:
        if ref.data is None:
            raise _missing(s, ref)
        with Image.open(io.BytesIO(ref.data)) as im:
            out.append(im.convert("RGB"))
    return out


def hf_image_cells(s: Sample) -> list[dict[str, Any]]:
    """``[{"bytes": ..., "path": ...}]``: a ``datasets.Image`` list cell (``path`` names the image:
    ``<digest>.<ext>``, or the URL of a remote image, which has no bytes)."""
    return [
        {"bytes": ref.data, "path": ref.url if ref.data is None else f"{ref.digest}.{ref.extension}"}
        for ref in s.images
    ]


def sidecar_folder(out: Path) -> Path:
    """The image folder of an export file: ``samples.jsonl`` -> ``samples.jsonl.images``."""
    return out.with_name(out.name + ".images")


class ImageSidecar:
    """Writes each distinct image once into ``folder``; paths are relative to ``base``."""

    def __init__(self, folder: Path, base: Path) -> None:
        self.folder = folder
        self.base = base
        self.written = 0
        """Files written by this export (an image already in the folder is not written again)."""
        self.used = 0
        """Image paths handed out (files written or already there)."""

    def path_of(self, ref: ImageRef) -> str | None:
        """Write ``ref``'s bytes when not there yet; its path relative to ``base`` (None: no bytes)."""
        if ref.data is None:
            return None
        name = f"{ref.digest}.{ref.extension}"
        target = self.folder / name
        if not target.exists():
            pending = current_output_set()  # inside an export: new files wait in a staging folder
            folder = self.folder if pending is None else pending.staging(self.folder)
            if (folder / name).exists():
                self.used += 1
                return os.path.relpath(target, self.base)
            folder.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{ref.digest[:16]}.", suffix=".tmp", dir=folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(ref.data)
                os.chmod(tmp, 0o666 & ~_umask())
                os.replace(tmp, folder / name)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            self.written += 1
        self.used += 1
        return os.path.relpath(target, self.base)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def warn_images_dropped(fmt: str, s: Sample, warned: list[bool]) -> None:
    """Log once per export that ``fmt`` does not carry images (openrlhf, value, slime-sft)."""
    if s.images and not warned:
        warned.append(True)
        log.warning(
            "%s: this format does not carry images; samples with images are written without them "
            "(jsonl, parquet, slime, verl, verl-sft and trl carry them)",
            fmt,
        )
