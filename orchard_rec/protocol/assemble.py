"""Alias module: stream reassembly and token extraction under their former module (they live per dialect now)."""

from __future__ import annotations

from orchard_rec.protocol import assemble, extract_tokens

__all__ = ["assemble", "extract_tokens"]
