"""Errors of the health probe, its policy and pair qualification."""

from __future__ import annotations

from specpair.errors import CannotRun, SpecpairError

__all__ = ["CannotProbe", "SnapshotError", "PolicyError", "ReportError"]


class CannotProbe(CannotRun):
    """NVML cannot be used on this host (no library, no driver): exit code 3."""


class SnapshotError(SpecpairError, ValueError):
    """A recorded NVML snapshot is unreadable, of another format, or incomplete."""


class PolicyError(SpecpairError, ValueError):
    """A health policy file is malformed or lacks the requested role."""


class ReportError(SpecpairError, ValueError):
    """A JSON health report given as input cannot be decoded."""
