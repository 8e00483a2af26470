"""The drafter worker's errors, one class per failure."""

from __future__ import annotations

from specpair.errors import SpecpairError

__all__ = ["ModelLoadError", "BadKeyFile"]


class ModelLoadError(SpecpairError):
    """The draft model directory is missing, malformed or cannot be loaded."""


class BadKeyFile(SpecpairError):
    """The pre-shared key file is missing, unreadable or too short."""
