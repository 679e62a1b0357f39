"""Glue that plugs recorded samples into RL trainers (torch only as an optional extra)."""

__all__: list[str] = []
