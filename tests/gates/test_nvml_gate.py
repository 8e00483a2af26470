"""NVML gate: this host's GPUs are healthy under the shipped policy and have the CUDA
capability its role expects.

Runs inside every image (`make gates`) and in `make test`. It skips, naming the reason, only
where no NVML/GPU is present (the CPU profile); anywhere NVML works it must pass.
SPECPAIR_ROLE picks the host role (sparkhead, sparkworker, x86host); without it the profile
is inferred from the GPU name. The Xid watch is 1 s at quick size, 10 s at full size.
"""

from __future__ import annotations

import os

import pytest

from specpair.health.errors import CannotProbe
from specpair.health.nvml import LiveNvml
from specpair.health.policy import evaluate, load_policy, select_profile
from specpair.health.probe import probe

WATCH_S = 10.0 if os.environ.get("SPECPAIR_GATE_SIZE") == "full" else 1.0
ROLE = os.environ.get("SPECPAIR_ROLE") or None


@pytest.fixture(scope="module")
def live_report():
    try:
        source = LiveNvml()
    except CannotProbe as e:
        pytest.skip(f"no NVIDIA GPU/NVML here: {e}")
    try:
        yield probe(source, "gate", WATCH_S)
    finally:
        source.close()


@pytest.mark.gate
def test_nvml_health_under_the_shipped_policy(live_report):
    assessment = evaluate(live_report, load_policy(), ROLE)
    failures = [f"{f.check} (GPU {f.gpu}): {f.message}" for f in assessment.findings
                if f.level == "fail"]
    assert assessment.status != "fail", failures


@pytest.mark.gate
def test_cuda_capability_matches_the_role(live_report):
    profile = select_profile(load_policy(), live_report, ROLE)
    want = tuple(profile.compute_capability)
    got = [g.identity.compute_capability for g in live_report.gpus]
    assert got == [want] * len(got), f"NVML compute capability {got}, profile {profile.name} " \
                                     f"expects sm_{want[0]}{want[1]}"
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA in this environment: NVML capability checked only")
    for i in range(torch.cuda.device_count()):
        assert torch.cuda.get_device_capability(i) == want
    arches = torch.cuda.get_arch_list()
    assert any(_runs_on(a, *want) for a in arches), \
        f"this torch build has no kernels for sm_{want[0]}{want[1]}: {arches}"


def _runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether a torch build target runs on sm_<major><minor>: a cubin sm_XY runs on the same
    major with minor >= Y (an "a" arch-specific cubin only on exactly XY); PTX compute_XY
    is JIT-compiled for any GPU at or above XY."""
    kind, _, num = arch.partition("_")
    am, an = divmod(int(num.rstrip("af")), 10)
    if kind == "compute":
        return (am, an) <= (major, minor)
    if num.endswith("a"):
        return (am, an) == (major, minor)
    return am == major and an <= minor
