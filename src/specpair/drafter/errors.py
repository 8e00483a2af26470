"""The drafter worker's errors, one class per failure."""

from __future__ import annotations

from specpair.errors import SpecpairError

__all__ = ["ModelLoadError"]


class ModelLoadError(SpecpairError):
    """The draft model directory is missing, malformed or cannot be loaded."""

