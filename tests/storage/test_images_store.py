"""Images recorded once: a browser-like session resending its last screenshots stores each
screenshot once (bytes, in ``images``), and every request and upstream request comes back
byte for byte; growing completions prompts stored as deltas (linear in the session)."""

from __future__ import annotations

import base64
import io
import json
import random
import urllib.request
from typing import Any

import orjson
import pytest
from factories import call, run_threads
from sqlalchemy import create_engine, text

from orchard_rec.records import Dialect
from orchard_rec.storage import Store, layout, migrate
from orchard_rec.storage.delta import Encoder

TURNS = 30
KEEP = 3  # the harness keeps its last 3 screenshots; older ones become text


def screenshot(k: int, w: int = 192, h: int = 144) -> bytes:
    """A real PNG (Pillow): a page-like picture with a noisy region, distinct per ``k``."""
    from PIL import Image, ImageDraw

    rng = random.Random(k)
    im = Image.new("RGB", (w, h), (240, 240, 240))
    d = ImageDraw.Draw(im)
    d.rectangle((0, 0, w, 18), fill=(30, 60, 120))
    d.text((4, 3), f"page {k}", fill=(255, 255, 255))
    for row in range(4):
        d.rectangle((8, 28 + 26 * row, 8 + rng.randrange(40, w - 16), 44 + 26 * row), fill=(200, 200, 210))
    px = im.load()
    assert px is not None
    for _ in range(1500):  # texture the compressor cannot fold away
        px[rng.randrange(w), rng.randrange(20, h)] = (
            rng.randrange(256),
            rng.randrange(256),
            rng.randrange(256),
        )
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _user_part(dialect: str, png: bytes | None, k: int) -> list[dict[str, Any]]:
    note = f"Step {k}: the page after your action."
    if png is None:
        return [
            {
                "type": "input_text" if dialect == "responses" else "text",
                "text": note + " [screenshot omitted]",
            }
        ]
    if dialect == "chat":
        return [
            {"type": "text", "text": note},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(png)}},
        ]
    if dialect == "responses":
        return [
            {"type": "input_text", "text": note},
            {"type": "input_image", "image_url": "data:image/png;base64," + _b64(png), "detail": "auto"},
        ]
    return [
        {"type": "text", "text": note},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(png)}},
    ]


def body(dialect: str, n: int, shots: list[bytes], answers: list[str]) -> dict[str, Any]:
    """Call ``n`` (0-based) of the session: the task, then per earlier step the model's answer and
    the screenshot after it; only the last ``KEEP`` screenshots are images."""
    task = "Open the settings page and turn on dark mode. " * 4
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": _user_part(dialect, shots[0], 0) + [{"type": "text", "text": task}]}
        if dialect != "responses"
        else {
            "type": "message",
            "role": "user",
            "content": [
                *_user_part(dialect, shots[0] if n < KEEP else None, 0),
                {"type": "input_text", "text": task},
            ],
        }
    ]
    if dialect != "responses" and n >= KEEP:
        msgs[0]["content"] = _user_part(dialect, None, 0) + [{"type": "text", "text": task}]
    for k in range(1, n + 1):
        png = shots[k] if k > n - KEEP else None
        if dialect == "responses":
            msgs.append({"type": "message", "role": "assistant", "content": answers[k - 1]})
            msgs.append({"type": "message", "role": "user", "content": _user_part(dialect, png, k)})
        else:
            msgs.append({"role": "assistant", "content": answers[k - 1]})
            msgs.append({"role": "user", "content": _user_part(dialect, png, k)})
    if dialect == "chat":
        return {"model": "demo", "messages": msgs, "max_tokens": 16, "temperature": 0.0}
    if dialect == "responses":
        return {
            "model": "demo",
            "instructions": "You operate a browser.",
            "input": msgs,
            "max_output_tokens": 16,
        }
    return {"model": "demo", "system": "You operate a browser.", "messages": msgs, "max_tokens": 16}


PATHS = {"chat": "v1/chat/completions", "responses": "v1/responses", "messages": "v1/messages"}
STYLES = [
    lambda b: json.dumps(b),
    lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False),
]


def _post(url: str, raw: bytes) -> Any:
    req = urllib.request.Request(
        url, data=raw, headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _answer(dialect: str, resp: Any) -> str:
    if dialect == "chat":
        return str(resp["choices"][0]["message"]["content"] or "")
    if dialect == "responses":
        return "".join(c.get("text", "") for o in resp["output"] for c in o.get("content") or ())
    return "".join(b.get("text", "") for b in resp["content"] if b.get("type") == "text")


def stored_bytes(url: str, session_id: str) -> dict[str, int]:
    """What the session occupies: its calls' rows, its blobs, and the images it refers to."""
    eng = create_engine(url)
    out = {"calls": 0, "blobs": 0}
    try:
        with eng.connect() as c:
            for row in c.execute(text("SELECT * FROM calls WHERE session_id = :s"), {"s": session_id}):
                for v in row:
                    if isinstance(v, (bytes, memoryview)):
                        out["calls"] += len(bytes(v))
                    elif isinstance(v, str):
                        out["calls"] += len(v.encode())
                    elif isinstance(v, (dict, list)):
                        out["calls"] += len(orjson.dumps(v))
                    elif v is not None:
                        out["calls"] += 8
            for row in c.execute(text("SELECT * FROM blobs WHERE session_id = :s"), {"s": session_id}):
                out["blobs"] += sum(
                    len(bytes(v)) if isinstance(v, (bytes, memoryview)) else 8 for v in row if v is not None
                )
    finally:
        eng.dispose()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_screenshot_session_stores_each_screenshot_once_and_rebuilds_every_call(
    upstream, proxy_factory, db_url, dialect
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="token")
    shots = [screenshot(k) for k in range(TURNS)]
    sid = f"gui-{dialect}"
    sent: list[bytes] = []
    answers: list[str] = []
    for n in range(TURNS):
        raw = STYLES[len(dialect) % 2](body(dialect, n, shots, answers)).encode()  # one client, one style
        sent.append(raw)
        answers.append(
            _answer(dialect, _post(f"{proxy.url}/s/{sid}/{PATHS[dialect]}", raw)) or f"clicked {n}"
        )
    proxy.flush()
    ups = [b for _path, b in upstream.fake.log]
    assert len(ups) == TURNS
    store = proxy.store()
    recs = store.calls(sid)
    assert [r.request_text.encode() for r in recs] == sent  # type: ignore[union-attr]
    assert [orjson.dumps(r.upstream_request) for r in recs] == [orjson.dumps(b) for b in ups]

    stats = store.image_stats()
    assert stats["images"] == TURNS  # every distinct screenshot once
    assert stats["bytes"] == sum(len(s) for s in shots)
    for k in (0, 7, TURNS - 1):
        got = store.image(__import__("hashlib").sha256(shots[k]).hexdigest())
        assert got == ("image/png", shots[k])
        info = store.image_info(__import__("hashlib").sha256(shots[k]).hexdigest())
        assert info is not None and (info.width, info.height) == (192, 144)
    assert store.image("0" * 64) is None
    used = stored_bytes(db_url, sid)
    sent_bytes = sum(len(s) for s in sent)
    session = used["calls"] + used["blobs"] + stats["bytes"]
    # the images once, plus what is not an image: a few KB per call (response, ids, new text)
    assert session <= stats["bytes"] + 4_000 * TURNS, (used, stats)
    assert used["blobs"] < 2_500 * TURNS, used  # no base64 left in the blobs
    # what the clients sent holds each screenshot ~3 times, as base64 (4/3 of the bytes)
    assert session * 3 < sent_bytes, (session, sent_bytes)
    print(f"{dialect}: sent {sent_bytes} B, stored {session} B = images {stats['bytes']} + {used}")
    store.close()


def read_with_small_cache(url: str, session_id: str, max_bytes: int) -> list[str]:
    """The session's request texts through a ``Reader`` whose blob cache holds almost nothing
    (every base and image fetched again once evicted)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session as OrmSession

    from orchard_rec.storage.delta import Reader
    from orchard_rec.storage.models import Call

    eng = create_engine(url)
    try:
        with OrmSession(eng) as db:
            reader = Reader(db.connection(), max_bytes=max_bytes)
            out = []
            for row in db.scalars(select(Call).where(Call.session_id == session_id).order_by(Call.seq)):
                p, c = reader.tokens(row.id, row.prompt_ids, row.completion_ids)
                out.append(reader.bodies(row, p, c)["request_text"])
            return out
    finally:
        eng.dispose()


def _record(dialect: Dialect, sid: str, n: int, raw: str, **kw: Any) -> Any:
    return call(
        sid, dialect=dialect, request=json.loads(raw), request_text=raw, received_at=float(n + 1), **kw
    )


def test_tool_result_screenshots_odd_base64_and_sessions_sharing_images(db_url: str) -> None:
    """Anthropic computer-use screenshots inside tool results are cut out too; base64 that does
    not re-encode identically (line breaks, no padding, escaped slashes) stays literal; two
    sessions written at once share the image rows."""
    store = Store(db_url)
    store.upgrade()
    shots = [screenshot(100 + k) for k in range(6)]
    odd = _b64(shots[5])
    odd_texts = [
        odd[:76] + "\\n" + odd[76:],  # a JSON-escaped line break inside the base64
        odd.rstrip("="),
    ]

    def raw(n: int, ses: str) -> str:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": f"task of {ses}"}]
        for k in range(n + 1):
            msgs.append(
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": f"t{k}",
                            "name": "computer",
                            "input": {"action": "screenshot"},
                        }
                    ],
                }
            )
            content = [
                {
                    "type": "tool_result",
                    "tool_use_id": f"t{k}",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": _b64(shots[k % 5]),
                            },
                        }
                    ],
                }
            ]
            msgs.append({"role": "user", "content": content})
        if n == 3:  # odd base64 in the last message, spelled by hand below
            msgs[-1]["content"] += [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": f"@ODD{j}@"},
                }
                for j in range(3)
            ]
        text_ = json.dumps({"model": "m", "messages": msgs, "max_tokens": 8})
        for j, spelled in enumerate([*odd_texts, _b64(shots[4]).replace("/", "\\/")]):
            text_ = text_.replace(f"@ODD{j}@", spelled)
        return text_

    texts = {ses: [raw(n, ses) for n in range(5)] for ses in ("ta", "tb")}
    stores = [store, Store(db_url)]

    def write(k: int) -> None:  # two stores (two engines) at once, a session each
        ses = list(texts)[k]
        for n, t in enumerate(texts[ses]):
            stores[k].write_batch([_record(Dialect.MESSAGES, ses, n, t)])

    run_threads(write, len(stores))
    for ses, want in texts.items():
        assert [r.request_text for r in store.calls(ses)] == want
        assert read_with_small_cache(db_url, ses, 1000) == want
    assert store.image_stats()["images"] == 5  # shots 0-4; the odd ones stayed literal
    for st in stores:
        st.close()


def test_image_spans_finds_each_dialects_images_and_only_exact_base64() -> None:
    png = screenshot(1)
    b = _b64(png)
    pieces = {
        "chat": json.dumps(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b}}],
            }
        ),
        "chat-str": json.dumps(
            {"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64," + b}]}
        ),
        "responses": json.dumps(
            {
                "type": "message",
                "content": [{"type": "input_image", "image_url": "data:image/png;base64," + b}],
            }
        ),
        "responses-out": json.dumps(
            {
                "type": "function_call_output",
                "output": [{"type": "input_image", "image_url": "data:image/png;base64," + b}],
            }
        ),
        "messages": json.dumps(
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b}}
                ],
            }
        ),
    }
    for name, piece in pieces.items():
        [(start, end, mime)] = layout.image_spans(piece)
        assert piece[start:end] == b and mime == "image/png", name
        assert layout.b64_exact(piece[start:end]) == png
        sha = __import__("hashlib").sha256(png).digest()
        own, holes = layout.cut(piece, [(start, end, sha)])
        assert b not in own and layout.paste(own, holes, {sha: b}) == piece
    assert layout.image_spans(json.dumps({"type": "text", "text": "data:image/png;base64," + b})) == []
    assert layout.b64_exact(b.rstrip("=")) is None and layout.b64_exact(b[:60] + "\n" + b[60:]) is None


def _completion_session(store: Store, sid: str, calls: int, ints: bool = False) -> list[str]:
    rng = random.Random(7)
    words = "the of and file test error def return import class value self none".split()
    prompt: Any = [] if ints else "You are a coding agent.\n" * 20
    sent = []
    for n in range(calls):
        new = " ".join(rng.choice(words) for _ in range(120)) + f'\nObservation {n}: ✓ "ok"\n'
        if ints:
            prompt = [*prompt, *(rng.randrange(50_000) for _ in range(150))]
        else:
            prompt = prompt + new
        req = {"model": "m", "prompt": prompt, "max_tokens": 64, "temperature": 0.0}
        raw = STYLES[int(ints)](req)
        completion = " ".join(rng.choice(words) for _ in range(40)) + " “done” \\ \n"
        comp_ids = [rng.randrange(50_000) for _ in range(50)]
        resp = {
            "id": f"c{n}",
            "object": "text_completion",
            "choices": [{"index": 0, "text": completion, "finish_reason": "stop"}],
        }
        store.write_batch(
            [
                call(
                    sid,
                    dialect=Dialect.COMPLETIONS,
                    request=req,
                    request_text=raw,
                    response=resp,
                    completion_ids=comp_ids,
                    received_at=float(n + 1),
                )
            ]
        )
        sent.append(raw)
        if not ints:
            prompt += completion
        else:
            prompt = [*prompt, *comp_ids]
    return sent


@pytest.mark.parametrize("style", range(4))
def test_a_completions_prompt_goes_on_with_the_previous_completion(db_url: str, style: int) -> None:
    """Each way a client writes the prompt (escapes, id lists with or without spaces) is recognised:
    the completion is referenced, not stored again, and the text comes back exact."""
    store = Store(db_url)
    store.upgrade()
    ints = style >= 2
    dump = [
        lambda b: json.dumps(b),
        lambda b: json.dumps(b, ensure_ascii=False, separators=(",", ":")),
        lambda b: json.dumps(b, separators=(",", ":")),
        lambda b: json.dumps(b),
    ][style]
    prompt: Any = list(range(300)) if ints else "Système: résous la tâche.\n" * 20
    sent = []
    for n in range(5):
        prompt = (
            [*prompt, *range(1000 * n, 1000 * n + 40)] if ints else prompt + f'\nObservation {n}: ✓ "ok"\t'
        )
        raw = dump({"model": "m", "prompt": prompt, "max_tokens": 8})
        text_, ids = f"Ich prüfe «{n}»\n", [7, 8, 9 + n]
        resp = {"choices": [{"index": 0, "text": text_, "finish_reason": "stop"}]}
        rec = call(
            "co", dialect=Dialect.COMPLETIONS, request=json.loads(raw), request_text=raw, response=resp
        )
        rec = __import__("dataclasses").replace(rec, completion_ids=tuple(ids), received_at=float(n + 1))
        store.write_batch([rec])
        sent.append(raw)
        prompt = [*prompt, *ids] if ints else prompt + text_
    assert [r.request_text for r in store.calls("co")] == sent
    eng = create_engine(db_url)
    with eng.connect() as c:
        styles = [r[0] for r in c.execute(text("SELECT base_style FROM blobs WHERE base_call IS NOT NULL"))]
    eng.dispose()
    assert styles == [style] * 4
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("ints", [False, True], ids=["text", "ids"])
def test_completions_prompts_grow_linearly_and_come_back_exact(db_url: str, ints: bool) -> None:
    store = Store(db_url)
    store.upgrade()
    half = _completion_session(store, "half", 50, ints)
    full = _completion_session(store, "full", 100, ints)
    b50, b100 = sum(stored_bytes(db_url, "half").values()), sum(stored_bytes(db_url, "full").values())
    print(
        f"completions ({'ids' if ints else 'text'}): 50 calls {b50} B, 100 calls {b100} B, final prompt {len(full[-1])} B"
    )
    assert b100 / b50 <= 2.2, (b50, b100)
    assert b100 < 3 * len(full[-1]), (b100, len(full[-1]))  # vs ~50x for whole prompts
    assert [r.request_text for r in store.calls("half")] == half
    assert [r.request_text for r in store.calls("full")] == full
    assert read_with_small_cache(db_url, "full", 20_000) == full  # bases evicted and read again
    # a fresh reader of one late call follows the chain through the database
    late = store.calls("full")[80].call_id
    again = Store(db_url)
    assert again.get_call(late).request_text == full[80]  # type: ignore[union-attr]

    # a writer that restarts mid-session continues the deltas (the last split is rebuilt once)
    def based() -> int:
        eng = create_engine(db_url)
        with eng.connect() as c:
            n = c.execute(
                text("SELECT count(*) FROM blobs WHERE session_id = 'full' AND base IS NOT NULL")
            ).scalar_one()
        eng.dispose()
        return int(n)

    before = based()
    assert before >= 98
    eng = create_engine(db_url)
    with eng.connect() as c:  # each prompt goes on with the previous completion, not stored again
        conts = c.execute(
            text("SELECT count(*) FROM blobs WHERE session_id = 'full' AND base_call IS NOT NULL")
        )
        assert conts.scalar_one() >= 98
    eng.dispose()
    req = json.loads(full[-1])
    last = again.calls("full")[-1]
    went_on = list(last.completion_ids or ()) if ints else last.response["choices"][0]["text"]  # type: ignore[index]
    req["prompt"] = req["prompt"] + went_on + ([1, 2, 3] if ints else "and one more turn")
    raw = STYLES[int(ints)](req)
    again.write_batch(
        [call("full", dialect=Dialect.COMPLETIONS, request=req, request_text=raw, received_at=1e4)]
    )
    assert based() == before + 1
    eng = create_engine(db_url)
    with eng.connect() as c:  # and it still refers to the completion before the restart
        got = c.execute(
            text("SELECT count(*) FROM blobs WHERE session_id = 'full' AND base_call IS NOT NULL")
        )
        assert got.scalar_one() == 100
    eng.dispose()
    assert again.calls("full")[-1].request_text == raw
    again.close()
    store.close()


def test_0006_on_a_database_written_by_the_0005_schema(db_url: str) -> None:
    """A database written as 0005 wrote it (whole blob texts, base64 inside) is upgraded in place:
    the old blobs' images move to ``images``, the old calls read back exact, new calls store images
    once; down again writes whole texts."""
    migrate.upgrade(db_url, "0005")
    old = Store(db_url)
    old.encoder = Encoder(parts=False)
    shots = [screenshot(200 + k) for k in range(8)]
    answers = [f"clicked {k}" for k in range(8)]
    sent = [STYLES[n % 2](body("chat", n, shots, answers)) for n in range(8)]
    for n in range(4):
        old.write_batch([_record(Dialect.CHAT, "mig", n, sent[n])])
    old.close()
    eng = create_engine(db_url)
    with eng.connect() as c:
        before = c.execute(text("SELECT count(*) FROM blobs")).scalar_one()
    eng.dispose()

    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    migrate.check(db_url)
    store = Store(db_url)
    assert [r.request_text for r in store.calls("mig")] == sent[:4]
    assert store.image_stats()["images"] == 4  # cut out of the old blobs: shots 0-3, once each
    for n in range(4, 8):  # a restarted writer continues the session with images
        store.write_batch([_record(Dialect.CHAT, "mig", n, sent[n])])
    assert [r.request_text for r in store.calls("mig")] == sent
    assert 0 < store.image_stats()["images"] <= 8
    prompts = _completion_session(store, "mig-c", 4)  # continuations, which the downgrade writes out
    eng = create_engine(db_url)
    with eng.connect() as c:
        assert c.execute(text("SELECT count(*) FROM blobs")).scalar_one() > before
        assert c.execute(text("SELECT count(*) FROM blobs WHERE images IS NOT NULL")).scalar_one() > 0
    eng.dispose()
    store.close()

    migrate.downgrade(db_url, "0005")
    eng = create_engine(db_url)
    with eng.connect() as c:
        datas = [
            bytes(r[0]).decode() for r in c.execute(text("SELECT data FROM blobs WHERE session_id = 'mig'"))
        ]
    eng.dispose()
    b64s = {_b64(s) for s in shots[1:]}
    assert sum(any(b in d for b in b64s) for d in datas) >= 4  # the base64 is back in the texts
    migrate.upgrade(db_url)
    store = Store(db_url)
    assert [r.request_text for r in store.calls("mig")] == sent
    assert [r.request_text for r in store.calls("mig-c")] == prompts
    store.close()


def test_a_sliding_window_harness_is_recognised_not_rehashed() -> None:
    """Messages dropped from the front (or one inserted) shift the rest: they are still found by
    comparing text, so only the new messages are hashed and scanned for images."""
    shots = [screenshot(300 + k) for k in range(12)]
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": _user_part("chat", shots[k], k) + [{"type": "text", "text": f"turn {k}"}]}
        for k in range(12)
    ]
    prev = None
    blobs: dict[bytes, str] = {}
    for n in range(4, 12):
        window = msgs[max(0, n - 6) : n]
        if n == 9:
            window = [{"role": "system", "content": "a reminder inserted in front"}, *window]
        sent = json.dumps({"model": "m", "messages": window})
        split = layout.split_request(sent, prev)
        blobs.update(split.blobs)
        assert layout.join_request(split.literals, split.refs, blobs) == sent
        if prev is not None:
            assert len(split.blobs) <= 2, n  # the new message (and the inserted one)
        prev = split


def test_odd_images_never_fail_a_batch(db_url: str) -> None:
    """A media type longer than the column and a forged header claiming a 4-billion-pixel width
    are stored (as None) rather than failing the writer's transaction."""
    store = Store(db_url)
    store.upgrade()
    png = bytearray(screenshot(400))
    png[16:20] = (2**32 - 1).to_bytes(4, "big")
    mime = "image/" + "x" * 200
    parts = [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + _b64(bytes(png))}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(screenshot(401))}},
    ]
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]})
    store.write_batch([_record(Dialect.CHAT, "odd", 0, raw)])
    assert [r.request_text for r in store.calls("odd")] == [raw]
    info = store.image_info(__import__("hashlib").sha256(bytes(png)).hexdigest())
    assert info is not None and info.mime is None and info.width is None and info.height == 144
    assert store.image(info.digest) == (None, bytes(png))
    store.close()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_completions_agent_through_the_proxy_stores_each_completion_once(
    upstream, proxy_factory, sqlite_url, stream
) -> None:  # type: ignore[no-untyped-def]
    """A client that appends each answer to its prompt, through ``serve --mode token``: every prompt
    after the first refers to the previous call's completion (as the client received it)."""
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    prompt = "You are a careful agent. Résumé: " * 12
    sent = []
    for n in range(4):
        prompt += f"\nObservation {n}: ok\n"
        raw = json.dumps({"model": "demo", "prompt": prompt, "max_tokens": 12, "stream": stream})
        req = urllib.request.Request(
            f"{proxy.url}/s/co-{stream}/v1/completions",
            data=raw.encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            body_ = r.read().decode()
        if stream:
            chunks = [json.loads(line[6:]) for line in body_.splitlines() if line.startswith("data: {")]
            answer = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        else:
            answer = json.loads(body_)["choices"][0]["text"]
        assert answer
        sent.append(raw)
        prompt += answer
    proxy.flush()
    store = proxy.store()
    assert [r.request_text for r in store.calls(f"co-{stream}")] == sent
    store.close()
    eng = create_engine(sqlite_url)
    with eng.connect() as c:
        conts = c.execute(text("SELECT count(*) FROM blobs WHERE base_call IS NOT NULL")).scalar_one()
    eng.dispose()
    assert conts == 3
