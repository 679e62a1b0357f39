"""Rebuilds a session's calls into token-level training samples (pure code, no I/O)."""

__all__: list[str] = []
