"""Proxy settings (pydantic at the edge: validated once, then read-only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Mode", "ProxyConfig"]

Mode = Literal["token", "passthrough"]


class ProxyConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream: str
    """The model server's base URL including ``/v1``, as a client would put in OPENAI_BASE_URL."""
    db: str = "sqlite:///./orchard.db"
    mode: Mode = "token"
    """``token``: ask a vLLM-style upstream for token ids and logprobs (and translate Responses and
    Messages to chat); ``passthrough``: forward every call natively, byte for byte."""
    max_body_bytes: int = Field(64 * 1024 * 1024, gt=0)
    connect_timeout: float = Field(10.0, gt=0)
    read_timeout: float = Field(600.0, gt=0)
    """Longest silence allowed between two upstream bytes."""

    @field_validator("upstream")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s) URL, got {v!r}")
        return v
