"""Errors of the build-time overlay machinery: one class per failure, all under OverlayError."""

from __future__ import annotations

from specpair.errors import SpecpairError

__all__ = [
    "OverlayError",
    "PatchFormatError",
    "PatchConflict",
    "WrongVllm",
    "BaseDrift",
    "ResultMismatch",
    "BadExclusion",
    "WheelHashMismatch",
]


class OverlayError(SpecpairError):
    """Base of every overlay failure."""


class PatchFormatError(OverlayError):
    """A patch file is not a well-formed unified diff."""


class PatchConflict(OverlayError):
    """A hunk's context or removed lines do not match the file it patches."""


class WrongVllm(OverlayError):
    """The site-packages holds no vLLM, or a version/variant the overlay does not know."""


class BaseDrift(OverlayError):
    """A file to patch differs from its pinned base (and is not the pinned result)."""


class ResultMismatch(OverlayError):
    """A patched file's sha256 differs from the pinned result."""


class BadExclusion(OverlayError):
    """--exclude names an unknown patch, or one whose files other patches also touch."""


class WheelHashMismatch(OverlayError):
    """A downloaded wheel's sha256 differs from its pin."""
