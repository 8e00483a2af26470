"""The runtime adapters raise their own errors inside vLLM, never build-time overlay errors."""

from __future__ import annotations

import pytest

from specpair.errors import SpecpairError
from specpair.overlay.errors import OverlayError
from specpair.vllm.errors import OverlayNotApplied, RemoteVerificationRefused
from specpair.vllm.v1 import RemoteProposer


@pytest.mark.parametrize("cls", [OverlayNotApplied, RemoteVerificationRefused])
def test_runtime_errors_are_specpair_errors_not_overlay_errors(cls):
    assert issubclass(cls, SpecpairError) and not issubclass(cls, OverlayError)


def test_an_unpatched_vllm_calling_propose_is_told_to_apply_the_overlay():
    """Unpatched V1 calls ``propose`` (patch 0001 calls ``propose_remote`` instead)."""
    proposer = RemoteProposer.__new__(RemoteProposer)  # no vLLM config needed to refuse
    with pytest.raises(OverlayNotApplied, match="specpair overlay apply"):
        proposer.propose([[1, 2]])
