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
    "WheelUnavailable",
    "BadOverlay",
    "ExclusionMismatch",
    "CannotWrite",
    "OutsideSite",
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


class WheelUnavailable(OverlayError):
    """A pinned wheel is not in the cache and `pip download` could not fetch it."""


class BadOverlay(OverlayError):
    """The overlay directory does not hold what its manifest pins (or no readable manifest)."""


class ExclusionMismatch(OverlayError):
    """The tree carries the overlay, whole or in part, with other exclusions than asked for."""


class CannotWrite(OverlayError):
    """A directory to write is read-only or not ours, or a write failed (disk full, I/O)."""


class OutsideSite(CannotWrite):
    """A directory to write resolves (through a symlink) outside --site-packages."""
