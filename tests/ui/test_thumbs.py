"""Thumbnails of each sample's images on the session page (``ui`` and ``show --html``)."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from orchard_rec.pipeline import iter_samples
from orchard_rec.storage import Store
from orchard_rec.ui import render_session_html
from orchard_rec.ui.thumbs import THUMB_SIDE, thumbnails
from tests.exporters.test_images_export import PAD, SHOTS, _gui_calls, _shots


@pytest.fixture
def gui_page(tmp_path: Path) -> tuple[str, list[Any]]:
    """The session page of a GUI session (4 turns, last two screenshots kept: 3 samples)."""
    url = f"sqlite:///{tmp_path / 'gui.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch(_gui_calls("gui", 2000.0))
    full = sorted(store.calls("gui"), key=lambda c: c.seq or 0)
    try:
        html = render_session_html(store, "gui")  # no tokenizer: image token unknown, no spans
        samples = list(iter_samples(store, sessions=["gui"]))
        with_spans = list(iter_samples(store, sessions=["gui"], image_token=PAD))
    finally:
        store.close()
    shots = {c.call_id: _shots(c) for c in full}
    for s in with_spans:  # with the image token known, each thumbnail names its token run
        assert [t["span"] for t in thumbnails(s)] == s.metadata["image_spans"]
    return html, [(s, shots[s.turns[-1].call_id]) for s in samples]


def test_each_sample_shows_thumbnails_of_its_images_in_order(gui_page) -> None:  # type: ignore[no-untyped-def]
    html, samples = gui_page
    assert len(samples) == 3
    for s, shots in samples:
        block = html.split(f'data-sample-index="{s.index}"', 1)[1].split('class="tokens"', 1)[0]
        figures = re.findall(r'<figure class="sample-image" data-digest="([0-9a-f]{64})"', block)
        assert figures == [im.digest for im in s.images] and len(figures) == len(shots) == 2
        srcs = re.findall(r'<img src="data:image/jpeg;base64,([^"]+)"', block)
        assert len(srcs) == 2
        for src, shot in zip(srcs, shots):
            with (
                Image.open(io.BytesIO(base64.b64decode(src))) as thumb,
                Image.open(io.BytesIO(SHOTS[shot][0])) as orig,
            ):
                assert max(thumb.size) <= THUMB_SIDE
                assert abs(thumb.size[0] / thumb.size[1] - orig.size[0] / orig.size[1]) < 0.05


def test_remote_images_are_named_not_fetched() -> None:
    from orchard_rec.dialects.images import ImageRef
    from orchard_rec.reconstruct import SampleBuilder

    b = SampleBuilder("s", [1, 2])
    b.append_generation([3], [-0.1], "c")
    s = b.build()
    s.images = [ImageRef("ab" * 32, url="https://example.invalid/x.png")]
    [t] = thumbnails(s)
    assert t["src"] is None and t["url"] == "https://example.invalid/x.png"


@pytest.mark.browser
@pytest.mark.slow  # starts a headless Chromium (~2.5 s)
def test_thumbnails_decode_in_chromium(gui_page, page) -> None:  # type: ignore[no-untyped-def]
    html, samples = gui_page
    page.page.set_content(html)
    page.settle()
    loaded = page.page.evaluate(
        """() => Array.from(document.querySelectorAll('.sample-image img'),
                  i => [i.complete, i.naturalWidth, i.naturalHeight])"""
    )
    assert len(loaded) == sum(len(s.images) for s, _ in samples)
    assert all(ok and w > 0 and h > 0 for ok, w, h in loaded)
