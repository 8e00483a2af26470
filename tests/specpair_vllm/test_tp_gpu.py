"""Tensor parallelism 2 on a machine with two CUDA GPUs: the GB10 target's shape (CUDA vLLM
0.32.0, Model Runner V2, the remote speculator) with the tiny pair and the in-process drafter
engine on rank 0.

The same detector as tests/e2e/test_tp2_pair.py on CPU: every token the TP = 2 engine emits for
a mixed batch of UNSEEDED requests (four sampling laws, the adaptive policy on) carries the
logprob that a target-only TP = 1 engine gives it when it re-scores the whole sequence; the
tolerance is checked to sit far above TP = 2 without speculation. Also: greedy completions equal
target-only TP = 2, only rank 0 drafts and exports, the guard never fired, specpair's accepted
drafts equal vLLM's, and four identical seeded requests give one completion.

Run on a machine with two GPUs and CUDA vLLM 0.32.0:  make test-gpu  (pytest -m gpu).
This suite has not run on the machine that wrote it (no GPU there).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.device_count() < 2,
                       reason=f"needs two NVIDIA GPUs (this host has "
                       f"{torch.cuda.device_count()})"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM 0.32.0"),
]

TOL = 1e-3  # nats, as on CPU
MIXED, MIXED_TOKENS = 24, 32


def test_tp2_on_two_gpus_emits_the_targets_tokens(tmp_path):
    from specpair.models.tiny import make_tiny
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from vllm_e2e_support import GREEDY_TOKENS, PROMPTS, overlaid_vllm, probe

    pair = make_tiny(tmp_path / "tiny")
    vllm_dir = overlaid_vllm(tmp_path / "vllm")
    common = dict(tp=2, prompts=PROMPTS, greedy_tokens=GREEDY_TOKENS, mixed=MIXED,
                  mixed_tokens=MIXED_TOKENS)
    ref2 = probe(vllm_dir, pair.target, tmp_path / "ref2.log", spec="none", **common)
    spec2 = probe(vllm_dir, pair.target, tmp_path / "spec2.log", spec="remote",
                  env={"SPECPAIR_DRAFTER": f"inproc:{pair.draft}"}, repeat=4, **common)
    runs = {"ref2": ref2["mixed"]["none"], "spec2": spec2["mixed"]["none"]}
    seqs = [s for name in runs for s in runs[name]]
    file = tmp_path / "rescore.json"
    file.write_text(json.dumps([{"prompt": s["prompt"], "tokens": s["tokens"]} for s in seqs]))
    ref = probe(vllm_dir, pair.target, tmp_path / "rescore.log", spec="none", prompts=PROMPTS,
                rescore=str(file))["rescored"]
    worst, i = {}, 0
    for name, got in runs.items():
        worst[name] = max(abs(a - b) for s, r in zip(got, ref[i:i + len(got)], strict=True)
                          for a, b in zip(s["logprobs"], r, strict=True))
        i += len(got)
    print(f"re-scoring, max |diff|: {worst}")
    assert worst["ref2"] < TOL / 10
    assert worst["spec2"] < TOL
    assert spec2["greedy"] == ref2["greedy"]
    r0, r1 = spec2["ranks"]
    assert r0["source"] and r0["metrics"] and not r1["source"] and not r1["metrics"]
    assert r0["mismatches"] == r1["mismatches"] == 0 and r0["steps"] == r1["steps"]
    by_mode = r0["counters"]["accepted_by"].values()
    accepted = [sum(c[k] for c in by_mode if k < len(c)) for k in range(3)]
    assert accepted == spec2["spec_metrics"]["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert accepted[0] > 0
    first, second = spec2["repeat"]
    assert len({tuple(t) for t in first + second}) == 1
