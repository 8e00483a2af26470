"""KL probe: shipped q vs q recomputed from the same logits and params.

The must-pass side ships exactly what the core's speculator draws from (`draft_step`);
the must-fail side reproduces the bug classes the probe guards against: q rounded to BF16
after sampling, a wrong temperature, a different truncation.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specpair.admission.kl_probe import KL_MAX, LOG_RATIO_MAX, kl_probe
from specpair.cli import main
from specpair.draft import draft_step
from specpair.proposal import QKind
from specpair.sampling import SamplingParams, process_logits

N, V = 6, 4096


@pytest.fixture(scope="module")
def logits():
    return torch.randn(N, V, generator=torch.Generator().manual_seed(3)) * 3


def _shipped(logits, params, draft_top_k=0):
    _, kind, q_logp, q_ids = draft_step(logits, params, torch.arange(N), draft_top_k=draft_top_k)
    return kind, q_logp, q_ids


@pytest.mark.parametrize("temperature, top_k, top_p, draft_top_k, kind", [
    (1.0, 0, 1.0, 0, QKind.DENSE),
    (0.7, 0, 0.9, 0, QKind.SPARSE),
    (1.3, 50, 1.0, 0, QKind.SPARSE),
    (1.0, 0, 1.0, 64, QKind.SPARSE),
])
def test_what_the_speculator_ships_passes(logits, temperature, top_k, top_p, draft_top_k, kind):
    params = SamplingParams.make(N, temperature, top_k, top_p)
    got_kind, q_logp, q_ids = _shipped(logits, params, draft_top_k)
    assert got_kind == kind
    v = kl_probe(logits, params, q_logp, q_ids, draft_top_k)
    assert v.passed, v.reasons
    assert v.worst_kl <= 1e-12 and v.worst_log_ratio <= 1e-6


def test_fp32_recomputation_noise_passes(logits):
    """A few ulps of reordering noise in log q (another device's reduction order) pass."""
    params = SamplingParams.make(N, 1.0)
    q = process_logits(logits, params)
    noisy = q + q.abs() * torch.finfo(torch.float32).eps * 4 * (
        torch.rand(q.shape, generator=torch.Generator().manual_seed(1)) - 0.5)
    v = kl_probe(logits, params, noisy)
    assert v.passed and 0 < v.worst_log_ratio <= LOG_RATIO_MAX


def test_bf16_rounded_after_sampling_fails(logits):
    params = SamplingParams.make(N, 1.0)
    q = process_logits(logits, params)
    shipped = q.exp().to(torch.bfloat16).float().log()
    v = kl_probe(logits, params, shipped)
    assert not v.passed and len(v.reasons) == N
    assert v.worst_log_ratio > LOG_RATIO_MAX and v.worst_kl > KL_MAX


def test_wrong_temperature_fails(logits):
    params = SamplingParams.make(N, 1.0)
    shipped = process_logits(logits, SamplingParams.make(N, 0.8))
    v = kl_probe(logits, params, shipped)
    assert not v.passed and v.worst_kl > 1e-3


def test_different_truncation_is_a_support_mismatch(logits):
    params = SamplingParams.make(N, 1.0, top_k=40)
    _, q_logp, q_ids = _shipped(logits, SamplingParams.make(N, 1.0, top_k=50))
    v = kl_probe(logits, params, q_logp, q_ids)
    assert not v.passed
    assert all(r.support_mismatch == 10 and r.max_abs_log_ratio == float("inf") for r in v.rows)
    # the shipped q covers the recomputed support, so KL(recomputed || shipped) is finite
    assert all(r.kl < float("inf") for r in v.rows)
    # the other way round the shipped q misses support: KL is infinite
    _, q_logp, q_ids = _shipped(logits, SamplingParams.make(N, 1.0, top_k=30))
    assert kl_probe(logits, params, q_logp, q_ids).worst_kl == float("inf")


def test_one_bad_row_is_named(logits):
    params = SamplingParams.make(N, 1.0)
    q = process_logits(logits, params).clone()
    q[4] = process_logits(logits[4:5], SamplingParams.make(1, 1.1))[0]
    v = kl_probe(logits, params, q)
    assert [r.row for r in v.rows if not r.ok] == [4]
    assert v.reasons[0].startswith("row 4: KL")


def _probe_file(path, logits, params, q_logp, q_ids=None, draft_top_k=0):
    tensors = {"logits": logits, "temperature": params.temperature, "top_k": params.top_k,
               "top_p": params.top_p, "q_logp": q_logp.contiguous()}
    if q_ids is not None:
        tensors["q_ids"] = q_ids.contiguous()
    save_file(tensors, str(path), metadata={"draft_top_k": str(draft_top_k)})


def test_cli(tmp_path, logits, capsys):
    params = SamplingParams.make(N, 0.9, 0, 0.95)
    _, q_logp, q_ids = _shipped(logits, params, 100)
    good = tmp_path / "good.safetensors"
    _probe_file(good, logits, params, q_logp, q_ids, 100)
    assert main(["admission", "kl-probe", str(good), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "QUALIFIED" and out["kl_max"] == KL_MAX
    bad = tmp_path / "bad.safetensors"
    _probe_file(bad, logits, params, q_logp, q_ids, 0)  # draft_top_k not declared: mismatch
    assert main(["admission", "kl-probe", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["stop"] is True and out["worst_log_ratio"] == "inf"
    junk = tmp_path / "junk.safetensors"
    save_file({"logits": logits}, str(junk))
    assert main(["admission", "kl-probe", str(junk)]) == 1
    assert "malformed probe input refused" in capsys.readouterr().out
    junk.write_bytes(b"not safetensors")
    assert main(["admission", "kl-probe", str(junk), "--json"]) == 1
    assert "malformed probe input refused" in json.loads(capsys.readouterr().out)["reasons"][0]
    wrong_ids = tmp_path / "ids.safetensors"
    _probe_file(wrong_ids, logits, params, q_logp, torch.full_like(q_ids, 10**9), 100)
    assert main(["admission", "kl-probe", str(wrong_ids)]) == 1
    assert "outside the vocabulary" in capsys.readouterr().out
    _probe_file(wrong_ids, logits, params, q_logp, q_ids.float(), 100)
    assert main(["admission", "kl-probe", str(wrong_ids)]) == 1
    assert "q_ids must be int64" in capsys.readouterr().out
