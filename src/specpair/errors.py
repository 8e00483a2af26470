"""The core's errors: one class per failure, all under SpecpairError."""

from __future__ import annotations

__all__ = ["SpecpairError", "InvalidProposal", "MissingDraftLaw", "IllegalPointMass"]


class SpecpairError(Exception):
    """Base of every error specpair raises on purpose."""


class InvalidProposal(SpecpairError, ValueError):
    """A proposal's tensors have the wrong shape, dtype or contents."""


class MissingDraftLaw(SpecpairError):
    """A proposal lacks q for some request and the caller asked to refuse it."""


class IllegalPointMass(SpecpairError):
    """Point-mass q was requested for drafts that were not declared greedy."""
