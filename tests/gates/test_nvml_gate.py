"""NVML gate: this host's GPUs are healthy under the shipped policy and have the CUDA
capability its role expects.

Runs inside every image (`make gates`) and in `make test`. Anywhere NVML works it must pass.
Where NVML finds no GPU it FAILS if the host has NVIDIA devices (a gate that cannot see its
hardware on the hardware must not pass): SPECPAIR_HOST_GPUS names what the gate runner found on
the host (images/bin/image-gates.sh, the Ansible gates role), and this process looks for itself
too (/dev/nvidia<N>, /proc/driver/nvidia under SPECPAIR_DEVICE_ROOT, default /). It skips,
naming the reason, only where there is no NVIDIA device at all (the CPU profile).
SPECPAIR_ROLE picks the host role (sparkhead, sparkworker, x86host); without it the profile
is inferred from the GPU name. The Xid watch is 1 s at quick size, 10 s at full size.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specpair.health.errors import CannotProbe
from specpair.health.nvml import LiveNvml
from specpair.health.policy import evaluate, load_policy, select_profile
from specpair.health.probe import probe

WATCH_S = 10.0 if os.environ.get("SPECPAIR_GATE_SIZE") == "full" else 1.0
ROLE = os.environ.get("SPECPAIR_ROLE") or None


def nvidia_devices() -> list[str]:
    """NVIDIA device evidence: the gate runner's view of the host plus this process's own."""
    root = Path(os.environ.get("SPECPAIR_DEVICE_ROOT", "/"))
    own = sorted(root.glob("dev/nvidia[0-9]*")) + [p for p in [root / "proc/driver/nvidia"]
                                                      if p.exists()]
    host = os.environ.get("SPECPAIR_HOST_GPUS", "").split()
    return sorted(set(host) | {"/" + str(p.relative_to(root)) for p in own})


@pytest.fixture(scope="module")
def live_report():
    try:
        source = LiveNvml()
    except CannotProbe as e:
        devices = nvidia_devices()
        if devices:
            pytest.fail(f"NVML found no GPU but the host has NVIDIA devices "
                        f"({', '.join(devices)}): the gate container was not given the GPUs "
                        f"(docker run --gpus all) or the driver is broken: {e}", pytrace=False)
        pytest.skip(f"no NVIDIA device on this host (no /dev/nvidia<N>, no /proc/driver/nvidia):"
                    f" nothing for NVML to check ({e})")
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

    if torch.version.cuda is None:
        pytest.skip("this image's torch is a CPU build: NVML capability checked only")
    assert torch.cuda.is_available(), \
        f"NVML sees {len(got)} GPU(s) but CUDA torch {torch.__version__} cannot use them"
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
