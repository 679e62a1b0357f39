"""Writers of training data in each trainer's format, registered by name."""

__all__: list[str] = []
