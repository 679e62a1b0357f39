"""Which intercepted requests are LLM calls: the dialect registry's routes (``intercept.addon.llm_route``)."""

from __future__ import annotations

from orchard_rec.intercept.addon import llm_route
from orchard_rec.records import Dialect

HOSTS = ("api.openai.com", "generativelanguage.googleapis.com")


def test_routes_keep_a_gateways_prefix_and_the_query() -> None:
    assert llm_route(HOSTS, "api.openai.com", "POST", "/v1/chat/completions?x=1") == (
        Dialect.CHAT,
        "",
        "/v1/chat/completions?x=1",
    )
    assert llm_route(HOSTS, "api.openai.com", "POST", "/openai/v1/responses") == (
        Dialect.RESPONSES,
        "/openai",
        "/v1/responses",
    )
    assert llm_route(HOSTS, "api.openai.com", "GET", "/v1/models") == (Dialect.MODELS, "", "/v1/models")
    assert llm_route(HOSTS, "api.openai.com", "GET", "/v1/chat/completions") is None
    assert llm_route(HOSTS, "example.com", "POST", "/v1/chat/completions") is None


def test_a_gemini_call_is_routed_by_its_dialect() -> None:
    path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=AIza"
    got = llm_route(HOSTS, "generativelanguage.googleapis.com", "POST", path)
    assert got == (Dialect("gemini"), "", path)
    assert (
        llm_route(HOSTS, "generativelanguage.googleapis.com", "POST", "/v1beta/models/m:countTokens") is None
    )


def test_the_default_hosts_include_gemini() -> None:
    from orchard_rec.intercept.config import DEFAULT_HOSTS

    got = llm_route(
        DEFAULT_HOSTS,
        "generativelanguage.googleapis.com",
        "POST",
        "/v1beta/models/m:streamGenerateContent?alt=sse",
    )
    assert got is not None and got[0] == Dialect("gemini")
