"""Adapters for agent harnesses: how each is redirected, tags sessions, and its quirks."""

__all__: list[str] = []
