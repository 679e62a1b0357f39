"""A streamed call's per-event arrival times and the upstream's response headers, recorded
through the real proxy over loopback (an upstream that paces its frames and sends secret
headers), by the database writer thread and by the writer process (``--db-writer process``,
which rebuilds the call from its spool line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from factories import check_paced_record, paced_stream_upstream, wait_for

from orchard_rec.proxy import BackgroundServer
from orchard_rec.proxy.app import RECORDER

pytestmark = pytest.mark.network


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_event_arrivals_and_response_headers_are_recorded(
    writer: str, proxy_factory: Any, tmp_path: Path
) -> None:
    import openai

    db = f"sqlite:///{tmp_path / 'timing.db'}"
    with BackgroundServer(paced_stream_upstream()) as up:
        proxy = proxy_factory(up.url + "/v1", db, db_writer=writer)
        rec = proxy.server.app[RECORDER]
        if writer == "process":
            wait_for(lambda: rec.proc is not None and rec.proc.ready(), timeout=30)
        assert rec.writer_state == writer
        client = openai.OpenAI(base_url=f"{proxy.url}/s/paced/v1", api_key="client-key", max_retries=0)
        got = client.chat.completions.create(
            model="paced", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in got if ch.choices)
        assert text == "one two three"
        proxy.flush()
    (c,) = proxy.store().calls("paced")
    check_paced_record(c)
