"""The host's floating-point platform: what decides whether two runs can agree bit for bit.

Float kernels round differently across torch builds, CPU capabilities and even CPU models of
one vendor and capability (MKL picks its kernels by the CPU: two AMD EPYCs reporting AVX512,
families 25 and 26, trained different bits from the same code and seeds, docs/models.md).
So a pinned digest of trained weights or drafted bits holds on the platform it was recorded
on, which is recorded beside it.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["host"]


def host() -> tuple[str, str, str, str]:
    """(torch version, its CPU capability, CPU vendor, "family F model M") of this host."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return (torch.__version__, torch.backends.cpu.get_cpu_capability(),
            info.get("vendor_id", "?"), f"family {info.get('cpu family', '?')} "
            f"model {info.get('model', '?')}")
