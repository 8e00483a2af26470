"""Runtime errors of the vLLM adapters the patches call: one class per failure.

The build-time overlay machinery (apply, verify, manifest) has its own errors in
``specpair.overlay.errors``; these are raised inside a running vLLM.
"""

from __future__ import annotations

from specpair.errors import SpecpairError

__all__ = ["OverlayNotApplied", "RanksDiverged", "RemoteVerificationRefused"]


class OverlayNotApplied(SpecpairError):
    """vLLM called a remote proposer the way an unpatched vLLM does (no overlay applied)."""


class RemoteVerificationRefused(SpecpairError):
    """vLLM was configured with a verification mode that cannot take remote sampled drafts."""


class RanksDiverged(SpecpairError):
    """The target's tensor-parallel ranks appended different tokens at a step: their token
    tables differ and every forward from then on mixes two histories, so the engine stops
    (its restart policy brings it back) rather than serve text the target would not."""
