"""The proxy's own OpenAPI description (``GET /openapi.json``).

It describes the routes the proxy answers (each dialect's from the registry, ``WireDialect.openapi``)
and the request fields it reads or validates;
bodies are open objects (``additionalProperties``), as the proxy forwards what it does
not know. The fuzz suite runs schemathesis against it.
"""

from __future__ import annotations

from typing import Any

from orchard_rec import dialects
from orchard_rec.records import SESSION_ID_PATTERN, SESSION_ID_RULE

__all__ = ["openapi_spec"]

_SID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{SESSION_ID_PATTERN}$", "description": SESSION_ID_RULE},
}


def _body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": True}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def openapi_spec() -> dict[str, Any]:
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
                "responses": {
                    "200": {
                        "description": "version, source, learned_at (the newest word); servers: each upstream's"
                    }
                },
            },
            "post": {
                "operationId": "set_policy",
                "requestBody": _body(
                    {"version": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}, ["version"]
                ),
                "responses": {
                    "200": {
                        "description": "version, source, learned_at; workers: how many took it (serve --workers)"
                    },
                    "400": {"description": "invalid"},
                },
            },
        },
    }
    for prefix, params in (("", []), ("/s/{session_id}", [_SID])):
        tag = "session_" if prefix else ""
        for d in dialects.known():  # every dialect's routes, as the registry lists them
            for path, item in d.openapi().items():
                paths[prefix + path] = {
                    method: {
                        **op,
                        "operationId": tag + op["operationId"],
                        "parameters": [*params, *op.get("parameters", ())],
                    }
                    for method, op in item.items()
                }
        paths[f"{prefix}/v1/models"] = {
            "get": {
                "operationId": f"{tag}models",
                "parameters": params,
                "responses": {
                    "200": {"description": "the upstream's answer, relayed"},
                    "502": {"description": "an error in the dialect's own shape"},
                },
            }
        }
    return {"openapi": "3.0.3", "info": {"title": "orchard-rec proxy", "version": "0.1.0"}, "paths": paths}
