"""Passthrough mode: calls carry no ids; reconstruction renders them with the model's chat
template (transformers) and marks the samples ``retokenized``. Against a canonical server
the result equals token mode's exact ids; against the drift server it does not, which is
why token mode exists."""

from __future__ import annotations

import pytest

from orchard_rec.pipeline import iter_samples

from .agents import AGENTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
]  # a Hugging Face tokenizer and chat templates: up to 30 s


def _samples(store, sid, tok=None):  # type: ignore[no-untyped-def]
    return list(iter_samples(store, sessions=[sid], tokenizer=tok))


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
@pytest.mark.parametrize("drift", [False, True])
def test_retokenized_samples_match_server_ids_only_without_drift(
    upstream_factory, proxy_factory, tmp_path, hf_tokenizer, dialect, drift
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(drift=drift)
    token = proxy_factory(up.url, f"sqlite:///{tmp_path / 'token.db'}", mode="token")
    passthrough = proxy_factory(up.url, f"sqlite:///{tmp_path / 'pass.db'}", mode="passthrough")
    suffix = "" if dialect == "messages" else "/v1"
    AGENTS[dialect](f"{token.url}/s/x{suffix}", None)
    AGENTS[dialect](f"{passthrough.url}/s/x{suffix}", None)
    token.flush()
    passthrough.flush()

    assert all(c.prompt_ids is None for c in passthrough.store().calls("x"))
    assert _samples(passthrough.store(), "x") == []  # no ids and no tokenizer: nothing to train on
    retok = _samples(passthrough.store(), "x", hf_tokenizer)
    exact = _samples(token.store(), "x", None)
    assert all(
        s.metadata["token_source"] == "retokenized" and s.metadata.get("missing_logprobs") for s in retok
    )
    assert all(s.metadata["token_source"] == "server" for s in exact)
    if not drift:
        assert [s.tokens for s in retok] == [s.tokens for s in exact]
        assert [s.loss_mask for s in retok] == [s.loss_mask for s in exact]
    else:
        assert [s.tokens for s in retok] != [s.tokens for s in exact]
