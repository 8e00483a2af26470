"""What the tiny pair's end-to-end modules share: the pair, its wire key and the overlaid vLLM
copy (``tiny_setup``), and the target-only reference run (``target_only``), each made once
per session: test_vllm_cpu_e2e.py and test_tp2_pair.py compare against the same reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm_e2e_support import (
    GREEDY_TOKENS,
    N_SPEC,
    PROMPTS,
    REF_SEEDS,
    SCHED_TOKENS,
    new_key_file,
    overlaid_vllm,
    probe,
)


@pytest.fixture(scope="session")
def tiny_setup(tmp_path_factory):
    """root (a directory for logs), pair (the tiny pair), key (its wire key), full (the
    overlaid vLLM copy)."""
    from specpair.models.tiny import make_tiny

    root = tmp_path_factory.mktemp("e2e")
    return SimpleNamespace(root=root, pair=make_tiny(root / "tiny"),
                           key=new_key_file(root / "key"),
                           full=overlaid_vllm(root / "vllm-full"))


@pytest.fixture(scope="session")
def target_only(tiny_setup):
    """Target-only vLLM (TP = 1, no speculation): greedy completions of PROMPTS and N_SPEC
    seeded T = 1 samples of prompt 0 (seeds REF_SEEDS + i)."""
    s = tiny_setup
    r = probe(s.full, s.pair.target, s.root / "ref.log", spec="none", prompts=PROMPTS,
              greedy_tokens=GREEDY_TOKENS, samples=N_SPEC, sample_tokens=SCHED_TOKENS,
              seed_base=REF_SEEDS)
    print(f"ref: start {r['start_s']:.1f}s, wall {r['wall_s']:.1f}s")
    return r
