"""The trajectory viewer: ``orchard-rec ui``, ``serve --ui`` (mounted at ``/ui``) and ``show --html``.

Owns the read-only web views over a recorded database (sessions table, session page with its
call waterfall, conversations, token-level samples and split points, the prompt compare view)
and their JSON API under ``/api/``. Server-rendered with Jinja2 on aiohttp; the templates and the
plain JavaScript/CSS under ``static/`` ship as package data (no Node build step).

May import: ``orchard_rec.storage`` (public ``Store`` reads, the ``sessions`` table for SQL
pagination, the search index), ``orchard_rec.pipeline`` (samples, recipe selection),
``orchard_rec.selection``, ``orchard_rec.reconstruct`` (the ``Sample`` type),
``orchard_rec.exporters`` (downloads), ``orchard_rec.records``, aiohttp and Jinja2. Never
``proxy`` (the proxy mounts the viewer, not the other way round).
Reads only, but for two opt-in writes: annotations (``writer``: a session's outcome through
``Store.set_outcome``) and "send again" (``resend_to``: a call replayed upstream, never
recorded). It opens an existing database and refuses one without the schema; it never
creates or migrates one.
"""

from orchard_rec.ui.app import build_ui_app, render_session_html
from orchard_rec.ui.data import UIError, open_store

__all__ = ["UIError", "build_ui_app", "open_store", "render_session_html"]
