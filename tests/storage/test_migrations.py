"""Alembic: the packaged migrations build exactly the models' schema, both ways, on both backends."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect

from orchard_rec.storage import migrate


def _tables(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        return set(inspect(eng).get_table_names())
    finally:
        eng.dispose()


def test_upgrade_from_empty_downgrade_and_upgrade_again(db_url: str) -> None:
    assert migrate.current(db_url) is None
    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    assert {"sessions", "calls", "alembic_version"} <= _tables(db_url)
    migrate.check(db_url)  # models and migrations agree (alembic check)

    migrate.downgrade(db_url, "base")
    assert migrate.current(db_url) is None
    assert not ({"sessions", "calls"} & _tables(db_url))

    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    migrate.check(db_url)


def test_migrations_ship_inside_the_package() -> None:
    import orchard_rec

    assert migrate.MIGRATIONS.parent == __import__("pathlib").Path(orchard_rec.__file__).parent
    assert (migrate.MIGRATIONS / "env.py").exists()
    assert list((migrate.MIGRATIONS / "versions").glob("0001_*.py"))


def test_0004_converts_a_database_of_the_previous_schema_in_place(db_url: str) -> None:
    """Rows of the 0003 shape (whole JSON bodies, JSON id lists) come back equal after the upgrade."""
    import json
    from datetime import UTC, datetime

    from sqlalchemy import text

    from orchard_rec.storage import Store

    migrate.upgrade(db_url, "0003")
    eng = create_engine(db_url)
    now = datetime.now(UTC)
    system = {"role": "system", "content": "be brief ☃ " * 50}
    calls = []
    for k in range(4):
        msgs = [system] + [{"role": "user", "content": f"q{j} é"} for j in range(k + 1)]
        request = {"messages": msgs, "model": "m", "stream": k % 2 == 1}
        prompt = list(range(100 + 10 * k))
        completion = [900 + k, 901 + k]
        upstream_request = {**request, "return_token_ids": True, "logprobs": True}
        response = {
            "id": f"r{k}",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "ok"},
                    "token_ids": completion,
                    "logprobs": {"content": []},
                }
            ],
        }
        events = [
            [None, {"choices": [{"delta": {"content": "ok"}, "token_ids": completion}]}],
            [None, "[DONE]"],
        ]
        calls.append(
            (f"c{k}", request, upstream_request, response, events, prompt, completion, [-0.5, -0.25])
        )
    with eng.begin() as c:
        c.execute(
            text("INSERT INTO sessions (id, created_at, updated_at, call_count) VALUES ('old', :t, :t, 5)"),
            {"t": now},
        )
        for seq, (cid, req, up, resp, ev, p, comp, lp) in enumerate(calls, 1):
            c.execute(
                text(
                    "INSERT INTO calls (id, session_id, seq, dialect, method, path, stream, status_code, outcome,"
                    " received_at, done_at, request, upstream_request, response, events, prompt_ids, completion_ids,"
                    " completion_logprobs, bytes_in, bytes_out) VALUES (:id, 'old', :seq, 'chat', 'POST',"
                    " '/v1/chat/completions', :stream, 200, 'ok', :t, :t, :req, :up, :resp, :ev, :p, :c, :lp, 0, 0)"
                ),
                {
                    "id": cid,
                    "seq": seq,
                    "stream": seq % 2 == 0,
                    "t": now,
                    **{
                        k: json.dumps(v)
                        for k, v in zip(
                            ("req", "up", "resp", "ev", "p", "c", "lp"), (req, up, resp, ev, p, comp, lp)
                        )
                    },
                },
            )
        c.execute(
            text(
                "INSERT INTO calls (id, session_id, seq, dialect, method, path, stream, outcome, received_at, done_at,"
                " bytes_in, bytes_out) VALUES ('m', 'old', 5, 'models', 'GET', '/v1/models', :f, 'ok', :t, :t, 0, 0)"
            ),
            {"t": now, "f": False},
        )
    eng.dispose()

    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    migrate.check(db_url)
    store = Store(db_url)
    back = store.calls("old")
    assert [r.call_id for r in back] == ["c0", "c1", "c2", "c3", "m"]
    for (_cid, req, up, resp, ev, p, comp, lp), r in zip(calls, back, strict=False):
        assert r.request == req and r.upstream_request == up
        assert (
            r.prompt_ids == tuple(p)
            and r.completion_ids == tuple(comp)
            and r.completion_logprobs == tuple(lp)
        )
        # the response and events as the client received them: the injected ids and logprobs null
        assert r.response["prompt_token_ids"] is None and r.response["choices"][0]["token_ids"] is None
        assert r.response["choices"][0]["logprobs"] is None and r.response["id"] == resp["id"]
        assert r.events[0][1]["choices"][0]["token_ids"] is None and r.events[1] == ev[1]
    assert back[4].request is None and back[4].prompt_ids is None
    store.close()
    # and back down: the old shape again
    migrate.downgrade(db_url, "0003")
    eng = create_engine(db_url)
    with eng.connect() as c:
        row = c.execute(text("SELECT prompt_ids, request FROM calls WHERE id = 'c3'")).one()
    eng.dispose()
    got = [json.loads(v) if isinstance(v, str) else v for v in row]
    assert got == [calls[3][5], calls[3][1]]
