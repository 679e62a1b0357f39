"""The viewer's aiohttp app: server-rendered pages, the JSON API under ``/api/``, static files.

Pages: ``/`` (sessions), ``/s/{id}`` (one session), ``/s/{id}/compare/{seq}`` (call ``seq``'s
prompt against the call before). API: ``GET /api/sessions`` (same filters as the page),
``/api/stats`` (for polling), ``/api/sessions/{id}``, ``/api/sessions/{id}/calls/{seq}``,
``/api/sessions/{id}/samples`` (the jsonl export's rows), ``/api/sessions/{id}/compare/{seq}``.
Database reads run in worker threads; the event loop only renders.
"""

from __future__ import annotations

import asyncio
import hmac
import shutil
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import orjson
from aiohttp import web

from orchard_rec.errors import OrchardError
from orchard_rec.records import CallRecord
from orchard_rec.storage.store import Store
from orchard_rec.ui.calls import Resend, resend
from orchard_rec.ui.compare import compare_calls
from orchard_rec.ui.curate import EXPORT_FORMATS, AnnotationError, annotate, export_file
from orchard_rec.ui.dash import DashQuery, dashboard
from orchard_rec.ui.data import (
    STATUSES,
    SessionFilter,
    SessionView,
    UIError,
    call_detail,
    harness_names,
    list_sessions,
    model_names,
    session_view,
    sessions_stats,
)
from orchard_rec.ui.groups import FILTERS, GroupError, attempt_diff, group_list, group_view, parse_select
from orchard_rec.ui.thumbs import thumbnails

__all__ = ["UI_STORE", "build_ui_app", "render_session_html"]

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
UI_STORE = web.AppKey("ui_store", Store)
_SETTINGS = web.AppKey("ui_settings", dict)
_COOKIE = "orchard_ui_key"


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _reward(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_reward(x)}" for k, x in v.items())
    return str(v)


def _num(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def _json_script(obj: Any) -> str:
    """JSON safe inside ``<script type="application/json">``."""
    return orjson.dumps(obj).decode().replace("</", "<\\/").replace("<!--", "<\\!--")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=jinja2.select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=_when, dur=_dur, reward=_reward, num=_num, json_script=_json_script, thumbs=thumbnails
    )
    env.globals["urlencode"] = urlencode
    return env


ENV = _env()


def _token_text(vocab: dict[int, str]) -> Callable[[int], str]:
    return lambda i: vocab.get(i, f"⟨{i}⟩")


def _session_context(view: SessionView, base: str, *, standalone: bool) -> dict[str, Any]:
    samples = view.samples
    return {
        "base": base,
        "standalone": standalone,
        "s": view.summary,
        "outcome": view.summary.outcome,
        "calls": view.call_rows,
        "samples": samples,
        "splits": view.splits,
        "token_text": _token_text(view.vocab),
        "token_source": view.token_source,
        "trained": sum(sum(s.loss_mask) for s in samples),
        "tokens": sum(len(s.tokens) for s in samples),
        "model": next((c["model"] for c in view.call_rows if c["model"]), None),
        "span": view.span,
        "errors": sum(1 for c in view.call_rows if c["error"] or c["outcome"] != "ok"),
        "data": view.data(with_calls=standalone),
    }


def render_session_html(
    store: Store,
    session_id: str,
    *,
    tokenizer: Any = None,
    on_mismatch: str = "split",
    credit: str = "assistant",
) -> str:
    """The session page as ONE self-contained HTML file (CSS, JS and every call's JSON inlined)."""
    view = session_view(store, session_id, tokenizer=tokenizer, on_mismatch=on_mismatch, credit=credit)
    ctx = _session_context(view, "", standalone=True)
    ctx["on_mismatch"] = on_mismatch
    ctx["inline_css"] = (STATIC / "ui.css").read_text()
    ctx["inline_js"] = (STATIC / "ui.js").read_text().replace("</script", "<\\/script")
    return ENV.get_template("session.html").render(ctx)


# -- handlers ------------------------------------------------------------------------------------


def _settings(request: web.Request) -> dict[str, Any]:
    return request.app[_SETTINGS]


async def _run(request: web.Request, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kw)


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


async def sessions_page(request: web.Request) -> web.Response:
    st = _settings(request)
    f = SessionFilter.from_query(request.query)
    page = await _run(request, list_sessions, request.app[UI_STORE], f, with_harnesses=True)
    ctx = {
        "base": st["base"],
        "page": page,
        "f": f,
        "statuses": STATUSES,
        "qs": lambda **kw: urlencode(f.query(**kw)),
        "standalone": False,
        "poll_ms": st["poll_ms"],
    }
    if request.query.get("fragment") == "rows":
        return _html(ENV.get_template("_rows.html").render(ctx))
    return _html(ENV.get_template("sessions.html").render(ctx))


async def session_page(request: web.Request) -> web.Response:
    st = _settings(request)
    view = await _run(
        request,
        session_view,
        request.app[UI_STORE],
        request.match_info["sid"],
        tokenizer=st["tokenizer"],
        on_mismatch=request.query.get("on_mismatch", st["on_mismatch"]),
        credit=request.query.get("credit", st["credit"]),
    )
    ctx = _session_context(view, st["base"], standalone=False)
    ctx["on_mismatch"] = request.query.get("on_mismatch", st["on_mismatch"])
    ctx["poll_ms"] = st["poll_ms"]
    ctx["resend"] = st["resend"] is not None
    ctx["annotate"] = st["writer"] is not None
    ctx["statuses"] = STATUSES[:-1]
    return _html(ENV.get_template("session.html").render(ctx))


def _seq(request: web.Request) -> int:
    try:
        return int(request.match_info["seq"])
    except ValueError:
        raise UIError(f"call sequence numbers are integers, got {request.match_info['seq']!r}") from None


async def compare_page(request: web.Request) -> web.Response:
    st = _settings(request)
    sid = request.match_info["sid"]
    cmp = await _run(request, compare_calls, request.app[UI_STORE], sid, _seq(request))
    view_vocab = await _run(request, _compare_vocab, request.app[UI_STORE], sid, st["tokenizer"], cmp)
    ctx = {
        "base": st["base"],
        "c": cmp,
        "sid": sid,
        "token_text": _token_text(view_vocab),
        "standalone": False,
    }
    return _html(ENV.get_template("compare.html").render(ctx))


def _compare_vocab(store: Store, sid: str, tokenizer: Any, cmp: dict[str, Any]) -> dict[int, str]:
    from orchard_rec.ui.data import _decode_one, recorded_vocab

    tok = cmp.get("tokens")
    if not tok:
        return {}
    ids = set(tok["held"]) | set(tok["sent"])
    if tokenizer is not None:
        return {i: _decode_one(tokenizer, i) for i in ids}
    rec = recorded_vocab(store.calls(sid))
    return {i: rec[i] for i in ids if i in rec}


async def api_sessions(request: web.Request) -> web.Response:
    f = SessionFilter.from_query(request.query)
    page = await _run(request, list_sessions, request.app[UI_STORE], f)
    return _json(page.to_json())


async def api_stats(request: web.Request) -> web.Response:
    return _json(await _run(request, sessions_stats, request.app[UI_STORE]))


async def api_session(request: web.Request) -> web.Response:
    st = _settings(request)
    view = await _run(
        request,
        session_view,
        request.app[UI_STORE],
        request.match_info["sid"],
        tokenizer=st["tokenizer"],
        on_mismatch=request.query.get("on_mismatch", st["on_mismatch"]),
        credit=request.query.get("credit", st["credit"]),
    )
    return _json(view.data())


def _find_call(store: Store, sid: str, seq: int) -> CallRecord:
    for c in store.calls(sid):
        if c.seq == seq:
            return c
    if store.session(sid) is None:
        raise UIError(f"no session {sid!r}", 404)
    raise UIError(f"session {sid!r} has no call {seq}", 404)


def _url_base(request: web.Request) -> str:
    """Where a copied curl points: the proxy itself when the viewer is mounted in it."""
    return f"{request.scheme}://{request.host}" if _settings(request)["base"] else "$ORCHARD_URL"


async def api_call(request: web.Request) -> web.Response:
    c = await _run(request, _find_call, request.app[UI_STORE], request.match_info["sid"], _seq(request))
    return _json(call_detail(c, _url_base(request)))


async def api_resend(request: web.Request) -> web.Response:
    """Send a recorded call again (opt-in); the new answer beside the recorded one. Never recorded."""
    target = _settings(request)["resend"]
    if target is None:
        raise UIError(
            "send again is off: start the viewer with --resend-to URL (or serve --ui --ui-resend)", 403
        )
    if request.headers.get("x-orchard-resend") != "1":  # a form on another site cannot set it
        raise UIError("send again needs the X-Orchard-Resend: 1 header", 400)
    c = await _run(request, _find_call, request.app[UI_STORE], request.match_info["sid"], _seq(request))
    return _json(await resend(c, target))


async def api_samples(request: web.Request) -> web.Response:
    st = _settings(request)
    view = await _run(
        request,
        session_view,
        request.app[UI_STORE],
        request.match_info["sid"],
        on_mismatch=request.query.get("on_mismatch", st["on_mismatch"]),
        credit=request.query.get("credit", st["credit"]),
    )
    return _json([s.to_dict() for s in view.samples])


async def api_compare(request: web.Request) -> web.Response:
    return _json(
        await _run(request, compare_calls, request.app[UI_STORE], request.match_info["sid"], _seq(request))
    )


async def session_stats(request: web.Request) -> web.Response:
    def read(store: Store, sid: str) -> dict[str, Any]:
        s = store.session(sid)
        if s is None:
            raise UIError(f"no session {sid!r}", 404)
        return {"calls": s.call_count, "updated": s.updated_at, "outcome": s.outcome is not None}

    return _json(await _run(request, read, request.app[UI_STORE], request.match_info["sid"]))


def _group_args(request: web.Request) -> dict[str, Any]:
    q = request.query
    seed_text = (q.get("seed") or "").strip()
    try:
        seed = int(seed_text) if seed_text else None
    except ValueError:
        raise UIError(f"seed must be an integer, got {seed_text!r}") from None
    try:
        bar = parse_select(q.get("select") or "")
    except GroupError as exc:
        raise UIError(str(exc)) from None
    return {"select_": bar, "filters": [f for f in q.getall("filter", []) if f], "seed": seed}


def _read_group(store: Store, key: str, value: str, args: dict[str, Any], pair: tuple[str, str]) -> Any:
    try:
        g = group_view(store, key, value, **args)
    except GroupError as exc:
        raise UIError(str(exc)) from None
    if not g.attempts:
        raise UIError(f"no session has {key} = {value!r} in its outcome metadata", 404)
    a, b = pair
    ids = [r.id for r in g.attempts]
    if not a or a not in ids:  # default: the first attempt, and the first one scored differently
        a = ids[0]
    if not b or b not in ids or b == a:
        ra = next(r.value for r in g.attempts if r.id == a)
        b = next((r.id for r in g.attempts if r.value != ra), next((i for i in ids if i != a), ""))
    diff = attempt_diff(store, a, b) if b else None
    return g, a, b, diff


async def groups_page(request: web.Request) -> web.Response:
    st = _settings(request)
    key = (request.query.get("key") or "task").strip()
    groups = await _run(request, group_list, request.app[UI_STORE], key)
    if request.path.endswith("/api/groups"):
        return _json({"key": key, "groups": groups})
    ctx = {"base": st["base"], "key": key, "groups": groups, "standalone": False}
    return _html(ENV.get_template("groups.html").render(ctx))


async def group_page(request: web.Request) -> web.Response:
    st = _settings(request)
    key, value = request.match_info["key"], request.match_info["value"]
    args = _group_args(request)
    pair = (request.query.get("a", ""), request.query.get("b", ""))
    g, a, b, diff = await _run(request, _read_group, request.app[UI_STORE], key, value, args, pair)
    if _is_api(request):
        return _json({**g.to_json(), "pair": diff and {"a": a, "b": b, "diverge": diff["diverge"]}})

    def qs(**changes: str) -> str:
        items = [(k, v) for k, v in request.query.items() if k not in changes]
        return urlencode(items + [(k, v) for k, v in changes.items() if v])

    ctx = {
        "base": st["base"],
        "g": g,
        "a": a,
        "b": b,
        "diff": diff,
        "qs": qs,
        "select_text": request.query.get("select", ""),
        "seed": args["seed"],
        "filter_names": list(FILTERS),
        "standalone": False,
    }
    return _html(ENV.get_template("group.html").render(ctx))


async def dash_page(request: web.Request) -> web.Response:
    st = _settings(request)
    f = SessionFilter.from_query(request.query)  # the same date and name parsing as the list
    q = DashQuery(since=f.since, until=f.until, harness=f.harness, model=f.model)
    store = request.app[UI_STORE]
    d = await _run(request, dashboard, store, q)
    if _is_api(request):
        return _json(d)
    names = await _run(request, lambda: (harness_names(store), model_names(store)))
    ctx = {"base": st["base"], "d": d, "q": q, "harnesses": names[0], "models": names[1], "standalone": False}
    return _html(ENV.get_template("dash.html").render(ctx))


async def api_annotate(request: web.Request) -> web.Response:
    """Set a session's reward, status, label or note (JSON: only the fields to change)."""
    writer = _settings(request)["writer"]
    if writer is None:
        raise UIError(
            "annotations are off: start the viewer with orchard-rec ui --annotate (serve --ui has them)", 403
        )
    if request.content_type != "application/json":  # a cross-site form cannot send JSON unasked
        raise UIError("annotations are sent as application/json", 415)
    try:
        fields = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise UIError(f"the annotation is not valid JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise UIError("the annotation is a JSON object of reward, status, label, note")
    sid = request.match_info["sid"]
    try:
        outcome = await _run(request, annotate, writer, sid, fields)
    except AnnotationError as exc:
        raise UIError(str(exc)) from None
    except LookupError as exc:
        raise UIError(str(exc), 404) from None
    return _json(
        {
            "session_id": sid,
            "reward": outcome.reward,
            "status": outcome.status,
            "metadata": dict(outcome.metadata),
        }
    )


async def api_export(request: web.Request) -> web.StreamResponse:
    """The export of the chosen sessions (``format=jsonl|parquet&session=ID&session=ID...``, in the
    query or a POSTed form: a long selection outgrows a URL) as a download."""
    q = await request.post() if request.method == "POST" else request.query  # POST: many sessions
    fmt = str(q.get("format", "jsonl"))
    ids = [str(s) for s in q.getall("session", []) if s]
    store = request.app[UI_STORE]
    try:
        path = await _run(request, export_file, store.url, fmt, ids)
    except AnnotationError as exc:
        raise UIError(str(exc)) from None
    except OrchardError as exc:
        raise UIError(str(exc)) from None
    try:
        resp = web.StreamResponse(
            headers={
                "Content-Type": EXPORT_FORMATS[fmt],
                "Content-Disposition": f'attachment; filename="orchard-{len(ids)}-sessions.{fmt}"',
                "Content-Length": str(path.stat().st_size),
            }
        )
        await resp.prepare(request)
        with path.open("rb") as fh:
            while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


# -- middleware: errors and keys ---------------------------------------------------------------


def _is_api(request: web.Request) -> bool:
    return "/api/" in request.path


@web.middleware
async def _ui_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except UIError as exc:
        if _is_api(request):
            return _json({"error": str(exc)}, exc.status)
        return _html(
            ENV.get_template("error.html").render(
                base=_settings(request)["base"], message=str(exc), standalone=False
            ),
            exc.status,
        )


def _key_middleware(keys: Sequence[str]) -> Any:
    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith(_settings(request)["base"] + "/static/"):
            return await handler(request)
        given = request.query.get("key")
        if given is not None and any(hmac.compare_digest(given, k) for k in keys):
            q = {k: v for k, v in request.query.items() if k != "key"}
            resp = web.HTTPFound(request.path + (("?" + urlencode(q)) if q else ""))
            resp.set_cookie(_COOKIE, given, httponly=True, samesite="Strict")
            raise resp
        auth = request.headers.get("authorization", "")
        presented = (
            auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        ) or request.cookies.get(_COOKIE)
        if presented and any(hmac.compare_digest(presented, k) for k in keys):
            return await handler(request)
        if _is_api(request):
            return _json({"error": "the viewer needs the proxy's admin key (Authorization: Bearer KEY)"}, 401)
        return _html(
            ENV.get_template("error.html").render(
                base=_settings(request)["base"],
                message="This viewer needs the proxy's admin key.",
                ask_key=True,
                standalone=False,
            ),
            401,
        )

    return check


def build_ui_app(
    store: Store,
    *,
    base: str = "",
    tokenizer: Any = None,
    keys: Sequence[str] = (),
    locked: bool | None = None,
    on_mismatch: str = "split",
    credit: str = "assistant",
    poll_ms: int = 2000,
    resend_to: Resend | None = None,
    writer: Store | None = None,
) -> web.Application:
    """The viewer over ``store`` (opened by the caller, e.g. with ``open_store``; never written).

    ``base``: the path it is mounted at (``""`` standalone, ``"/ui"`` inside the proxy), for links.
    ``keys``: when given, every page and API call needs one (header, or ``?key=`` once: a cookie).
    ``locked`` (default: whether keys are given): with no key, nothing is served.
    ``resend_to``: where "send again" replays a call (off when None, the default).
    ``writer``: a store open for writing, for annotations only (off when None, the default).
    """
    middlewares: list[Any] = [_ui_errors]
    if keys or locked:
        middlewares.insert(0, _key_middleware(tuple(keys)))
    app = web.Application(middlewares=middlewares)
    app[UI_STORE] = store
    app[_SETTINGS] = {
        "base": base.rstrip("/"),
        "tokenizer": tokenizer,
        "on_mismatch": on_mismatch,
        "credit": credit,
        "poll_ms": poll_ms,
        "resend": resend_to,
        "writer": writer,
    }
    r = app.router
    r.add_get("/", sessions_page)
    r.add_get("/s/{sid}", session_page)
    r.add_get("/s/{sid}/compare/{seq}", compare_page)
    r.add_get("/groups", groups_page)
    r.add_get("/groups/{key}/{value}", group_page)
    r.add_get("/api/groups", groups_page)
    r.add_get("/api/groups/{key}/{value}", group_page)
    r.add_get("/api/sessions", api_sessions)
    r.add_get("/api/stats", api_stats)
    r.add_get("/api/sessions/{sid}", api_session)
    r.add_get("/api/sessions/{sid}/stats", session_stats)
    r.add_get("/api/sessions/{sid}/calls/{seq}", api_call)
    r.add_post("/api/sessions/{sid}/calls/{seq}/resend", api_resend)
    r.add_post("/api/sessions/{sid}/outcome", api_annotate)
    r.add_get("/api/export", api_export)
    r.add_post("/api/export", api_export)
    r.add_get("/dash", dash_page)
    r.add_get("/api/dash", dash_page)
    r.add_get("/api/sessions/{sid}/samples", api_samples)
    r.add_get("/api/sessions/{sid}/compare/{seq}", api_compare)
    r.add_static("/static/", STATIC)
    return app
