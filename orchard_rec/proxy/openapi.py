"""The proxy's own OpenAPI description (``GET /openapi.json``).

It describes the routes the proxy answers and the request fields it reads or validates;
bodies are open objects (``additionalProperties``), as the proxy forwards what it does
not know. The fuzz suite runs schemathesis against it.
"""

from __future__ import annotations

from typing import Any

from orchard_rec.records import SESSION_ID_PATTERN, SESSION_ID_RULE

__all__ = ["openapi_spec"]

_MESSAGE = {"type": "object", "properties": {"role": {"type": "string"}, "content": {}}, "required": ["role"]}
_TOOL = {"type": "object", "additionalProperties": True}


def _body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": True}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "200": {"description": "the upstream's answer, relayed (JSON or server-sent events)"}
    }
    for c in codes:
        out[str(c)] = {"description": "an error in the dialect's own shape"}
    return out


_SID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{SESSION_ID_PATTERN}$", "description": SESSION_ID_RULE},
}


def openapi_spec() -> dict[str, Any]:
    chat = _body(
        {
            "model": {"type": "string"},
            "messages": {"type": "array", "items": _MESSAGE},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": _TOOL},
            "max_tokens": {"type": "integer", "minimum": 1},
        },
        ["model", "messages"],
    )
    completions = _body(
        {
            "model": {"type": "string"},
            "prompt": {"type": "string"},
            "stream": {"type": "boolean"},
            "max_tokens": {"type": "integer", "minimum": 1},
        },
        ["model", "prompt"],
    )
    responses = _body(
        {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
            "instructions": {"type": "string"},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": _TOOL},
        },
        ["model", "input"],
    )
    messages = _body(
        {
            "model": {"type": "string"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "messages": {"type": "array", "items": _MESSAGE},
            "system": {},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": _TOOL},
        },
        ["model", "max_tokens", "messages"],
    )
    outcome = _body(
        {
            "reward": {
                "oneOf": [
                    {"type": "number"},
                    {"type": "object", "additionalProperties": {"type": "number"}},
                    {"type": "null"},
                ]
            },
            "status": {
                "type": ["string", "null"],
                "enum": ["completed", "truncated", "aborted", "failed", None],
            },
            "step_values": {"type": ["array", "null"], "items": {"type": "number"}},
            "metadata": {
                "type": ["object", "null"],
                "description": "keys merge into the stored ones; a null value removes its key",
            },
            "create": {"type": "boolean"},
        },
        [],
    )
    outcome["description"] = (
        "Fields given merge into the stored outcome; null clears a field. A body that names"
        " nothing to change is a 400. Numbers must be finite."
    )
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "responses": {"200": {"description": "ready; status ok or degraded"}},
            }
        },
        "/metrics": {
            "get": {"operationId": "metrics", "responses": {"200": {"description": "Prometheus text"}}}
        },
        "/sessions/{session_id}/outcome": {
            "post": {
                "operationId": "outcome",
                "parameters": [_SID],
                "requestBody": outcome,
                "responses": {
                    "200": {"description": "recorded; the merged outcome in `outcome`"},
                    "400": {"description": "invalid"},
                    "404": {"description": "no such session (and create was not true)"},
                },
            }
        },
        "/v1/orchard/policy": {  # asynchronous RL: the trainer's policy version (proxy.versions)
            "get": {
                "operationId": "policy",
                "responses": {"200": {"description": "version, source, learned_at"}},
            },
            "post": {
                "operationId": "set_policy",
                "requestBody": _body(
                    {"version": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}, ["version"]
                ),
                "responses": {
                    "200": {"description": "version, source, learned_at"},
                    "400": {"description": "invalid"},
                },
            },
        },
    }
    for prefix, params in (("", []), ("/s/{session_id}", [_SID])):
        tag = "session_" if prefix else ""
        paths[f"{prefix}/v1/chat/completions"] = {
            "post": {
                "operationId": f"{tag}chat",
                "parameters": params,
                "requestBody": chat,
                "responses": _errors(400, 413, 415, 502),
            }
        }
        paths[f"{prefix}/v1/completions"] = {
            "post": {
                "operationId": f"{tag}completions",
                "parameters": params,
                "requestBody": completions,
                "responses": _errors(400, 413, 415, 502),
            }
        }
        paths[f"{prefix}/v1/responses"] = {
            "post": {
                "operationId": f"{tag}responses",
                "parameters": params,
                "requestBody": responses,
                "responses": _errors(400, 413, 415, 502),
            }
        }
        paths[f"{prefix}/v1/messages"] = {
            "post": {
                "operationId": f"{tag}messages",
                "parameters": params,
                "requestBody": messages,
                "responses": _errors(400, 413, 415, 502),
            }
        }
        paths[f"{prefix}/v1/models"] = {
            "get": {"operationId": f"{tag}models", "parameters": params, "responses": _errors(502)}
        }
    return {"openapi": "3.0.3", "info": {"title": "orchard-rec proxy", "version": "0.1.0"}, "paths": paths}
