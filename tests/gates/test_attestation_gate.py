"""Attestation gate: the running environment's vLLM carries the overlay, intact.

Re-verifies ``<site-packages>/vllm/SPECPAIR_OVERLAY.json`` against the files
installed right now (inside the target image: the image's site-packages): the
vLLM build is one the manifest knows, every touched file has its pinned result
sha256, the attestation names this overlay and excludes no patch. Skips (with
the reason) where vLLM or the overlay is not installed, unless
SPECPAIR_REQUIRE_OVERLAY=1 (set in the target image), where that is a failure.
"""

from __future__ import annotations

import pytest

from specpair.overlay.manifest import load_manifest
from specpair.overlay.status import status, verify


@pytest.mark.gate
def test_installed_vllm_matches_its_attestation(overlaid_site):
    site = overlaid_site
    man = load_manifest()
    st = verify(site, man)  # raises ResultMismatch naming every drifted file
    assert st.state == "applied" and not st.problems
    att = st.attestation
    assert att.overlay_id == man.overlay_id and att.vllm_version == man.vllm_version
    assert att.excluded == (), f"production vLLM must carry the whole series, not {att.excluded}"
    for path, h in att.files.items():
        assert h["result"] == man.files[path].result[st.variant], path


@pytest.mark.gate
def test_control_a_changed_byte_is_caught(overlaid_site, tmp_path):
    """Must-fail control: the same check on a copy with one patched byte changed fails."""
    site = overlaid_site
    from specpair.overlay.errors import ResultMismatch
    from specpair.overlay.shadow_copy import shadow_copy

    copy = shadow_copy(site, tmp_path)
    victim = copy / "vllm/v1/worker/gpu_model_runner.py"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.unlink()
    victim.write_bytes(bytes(data))
    assert status(copy, load_manifest()).state == "drifted"
    with pytest.raises(ResultMismatch, match="gpu_model_runner.py"):
        verify(copy, load_manifest())
