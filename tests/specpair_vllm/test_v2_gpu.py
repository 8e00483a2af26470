"""Model Runner V2 on a CUDA machine: the remote speculator against vLLM's Triton verifier.

Run on a CUDA machine with vLLM 0.32.0 (CUDA) installed:  make test-gpu  (pytest -m gpu).

1. Kernel level: q (a random law, top-k truncated) is written by
   ``specpair.vllm.v2.write_draft_logits`` as T * log q, drafts are drawn from q,
   and vLLM's own ``rejection_sample`` (spec_decode/rejection_sampler_utils.py)
   verifies them. The first emitted token must follow p = softmax(target / T)
   and the second, among trials that accepted draft 0, p1. Chi-square per
   position against the exact law, threshold chi2.isf(1e-6 / 2, df), 200k trials.
   Control: storing log q WITHOUT the factor T (what a q shipped as plain
   logits would give, since the verifier divides by T on load) must fail.
2. Drafts flagged invalid (-1, what ``merge_invalid_drafts`` produces for a
   MISSING q) are never accepted and the first token still follows p exactly.
3. End to end: the tiny pair through an overlaid copy of the installed CUDA
   vLLM (Model Runner V2, remote speculator, in-process drafter engine):
   greedy identity and the two-sample chi-square against target-only vLLM.

This suite has not run on the machine that wrote it (no GPU there).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from scipy.stats import chi2

from specpair.proposal import QKind
from specpair.qlaw import Drafts
from specpair.vllm.v2 import write_draft_logits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM 0.32.0"),
]

V, K, T = 48, 3, 0.7
TRIALS = 200_000
ALPHA = 1e-6


def _chi2(tokens: torch.Tensor, p: torch.Tensor, alpha: float) -> tuple[float, float]:
    counts = torch.bincount(tokens, minlength=p.numel()).double().cpu()
    exp = p.double().cpu() * tokens.numel()
    keep = exp >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    ex = torch.cat([exp[keep], exp[~keep].sum().view(1)])
    nz = ex > 0
    stat = float(((obs[nz] - ex[nz]) ** 2 / ex[nz]).sum())
    return stat, float(chi2.isf(alpha, int(nz.sum()) - 1))


def _verify(draft_logits_scale: float, invalid: bool = False):
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(K + 1, V, generator=g) * 2  # target logits per position
    lq = torch.log_softmax(torch.randn(K, V, generator=g) * 2, -1)
    lq[:, V // 2:] = float("-inf")  # truncated q (top half excluded)
    lq = lq - torch.logsumexp(lq, -1, keepdim=True)
    r = TRIALS
    drafts = torch.multinomial(lq.exp(), r, replacement=True, generator=g).T.contiguous()  # [r,K]
    buf = torch.zeros(r, K, V, dtype=torch.float32, device=dev)
    if draft_logits_scale == T:
        write_draft_logits(buf, list(range(r)),
                           [Drafts(drafts[i], QKind.DENSE, lq, None) for i in range(r)], [T] * r)
    else:  # the control: log q stored without the temperature factor
        buf[:] = lq.to(dev) * draft_logits_scale
    n = K + 1
    draft_sampled = torch.zeros(r, n, dtype=torch.int64)
    draft_sampled[:, 1:] = -1 if invalid else drafts
    target = (raw / T).repeat(r, 1).to(dev)  # processed logits: temperature applied
    out, num = rejection_sample(
        target, buf, draft_sampled.view(-1).to(dev),
        torch.arange(0, r * n + 1, n, dtype=torch.int32, device=dev),
        torch.arange(n, dtype=torch.int64).repeat(r).to(dev) + 100,
        torch.arange(r, dtype=torch.int32, device=dev),
        torch.arange(r, dtype=torch.int32, device=dev).repeat_interleave(n),
        torch.arange(n, dtype=torch.int32, device=dev).repeat(r),
        torch.full((r,), T, device=dev), torch.arange(r, dtype=torch.int64, device=dev), K)
    return raw, drafts, out.cpu(), num.cpu()


def test_remote_q_through_vllms_triton_verifier_keeps_the_target_law():
    raw, drafts, out, num = _verify(T)
    p = torch.softmax(raw / T, -1)
    s0, t0 = _chi2(out[:, 0], p[0], ALPHA / 2)
    acc0 = out[:, 0] == drafts[:, 0]
    s1, t1 = _chi2(out[acc0, 1], p[1], ALPHA / 2)
    assert s0 <= t0 and s1 <= t1, (s0, t0, s1, t1)
    assert 0.1 < float(acc0.double().mean()) < 1.0
    assert (num >= 1).all()


def test_control_q_without_the_temperature_factor_fails():
    raw, drafts, out, _ = _verify(1.0)
    p = torch.softmax(raw / T, -1)
    s0, t0 = _chi2(out[:, 0], p[0], ALPHA / 2)
    acc0 = out[:, 0] == drafts[:, 0]
    s1, t1 = _chi2(out[acc0, 1], p[1], ALPHA / 2)
    assert s0 > t0 or s1 > t1


def test_invalid_drafts_are_rejected_and_the_step_is_target_only():
    raw, _, out, num = _verify(T, invalid=True)
    assert (num == 1).all()  # nothing accepted: one token from the target
    s0, t0 = _chi2(out[:, 0], torch.softmax(raw / T, -1)[0], ALPHA)
    assert s0 <= t0


@pytest.mark.slow
def test_v2_end_to_end_remote_speculation(tmp_path):
    import sys
    from pathlib import Path

    from specpair.models.tiny import make_tiny
    from vllm_checks.twosample import per_index
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from vllm_e2e_support import overlaid_vllm, probe

    pair = make_tiny(tmp_path / "tiny")
    vllm_dir = overlaid_vllm(tmp_path / "vllm")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    common = dict(prompts=prompts, greedy_tokens=16, samples=2000, sample_tokens=4)
    spec = probe(vllm_dir, pair.target, tmp_path / "spec.log",
                 env={"SPECPAIR_DRAFTER": f"inproc:{pair.draft}"}, spec="remote", **common)
    ref = probe(vllm_dir, pair.target, tmp_path / "ref.log", spec="none", seed_base=1_000_000,
                **common)
    assert spec["greedy"] == ref["greedy"]
    assert all(c.passed for c in per_index(spec["samples"], ref["samples"], (1, 2, 3), ALPHA))
    assert spec["spec_metrics"]["vllm:spec_decode_num_accepted_tokens"] > 0
