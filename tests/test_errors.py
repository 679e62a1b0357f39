"""The error tree drawn in ``orchard_rec.errors``' docstring is the tree of the classes."""

from __future__ import annotations

import re

import orjson
import pytest

from orchard_rec import errors
from orchard_rec.dialects import error_body, get
from orchard_rec.errors import (
    BadRequest,
    ExportError,
    OrchardError,
    Rejected,
    SessionNotFound,
    UpstreamError,
    UpstreamStatus,
    UsageError,
)

_LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z]\w+) \((?P<status>\d+)\)")


def _drawn() -> list[tuple[int, str, int]]:
    """(depth, class name, status) for each class drawn in the module docstring."""
    out = []
    for line in (errors.__doc__ or "").splitlines():
        m = _LINE.match(line.strip("\n")[4:]) if line.startswith("    ") else None
        if m:
            out.append((len(m["indent"]) // 4, m["name"], int(m["status"])))
    return out


def test_the_docstring_tree_is_the_class_tree() -> None:
    drawn = _drawn()
    assert drawn[0] == (0, "OrchardError", 500)
    stack: list[str] = []
    for depth, name, status in drawn:
        cls = getattr(errors, name)
        assert cls.status == status, f"{name} is drawn with {status} but answers {cls.status}"
        del stack[depth:]
        if stack:
            assert cls.__bases__ == (getattr(errors, stack[-1]),), f"{name} is not drawn under its base"
        stack.append(name)


def test_every_error_class_is_drawn_and_exported() -> None:
    drawn = {name for _d, name, _s in _drawn()}
    defined = {
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, OrchardError) and obj.__module__ == errors.__name__
    }
    assert defined == drawn
    assert drawn <= set(errors.__all__)


def test_status_is_a_class_attribute_never_per_instance() -> None:
    e = BadRequest("x")
    assert "status" not in vars(e)
    assert Rejected.of(405) is errors.MethodNotAllowed
    assert Rejected.of(400) is BadRequest
    assert Rejected.of(404) is errors.NotFound
    built = Rejected.of(431)
    assert built is Rejected.of(431) and built.status == 431 and issubclass(built, Rejected)
    with pytest.raises(ValueError):
        Rejected.of(500)


def test_an_upstream_status_keeps_its_family() -> None:
    five = UpstreamStatus.of(503)
    assert five is UpstreamStatus.of(503) and five.status == 503
    assert issubclass(five, UpstreamError) and not issubclass(five, Rejected)
    assert orjson.loads(error_body(five("x"), get("chat")))["error"]["type"] == "upstream_error"
    four = UpstreamStatus.of(400)
    assert four.status == 400
    assert orjson.loads(error_body(four("x"), get("chat")))["error"]["type"] == "invalid_request_error"
    assert orjson.loads(error_body(four("x"), get("messages")))["error"]["type"] == "invalid_request_error"
    with pytest.raises(ValueError):
        UpstreamStatus.of(200)


def test_user_errors_share_the_base_with_exit_codes() -> None:
    assert issubclass(UsageError, OrchardError) and UsageError.exit_code == 2
    assert issubclass(ExportError, OrchardError) and ExportError.exit_code == 1
    assert issubclass(SessionNotFound, errors.NotFound) and SessionNotFound.status == 404
    from orchard_rec.exporters import ExportError as Exported

    assert Exported is ExportError


def test_error_bodies_in_each_dialect() -> None:
    e = errors.TooManyRequests("busy")
    assert orjson.loads(error_body(e, get("chat"))) == {
        "error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": "proxy_at_capacity"}
    }
    assert orjson.loads(error_body(e, get("messages"))) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "busy"},
    }
