"""The greedy near-tie gate `pp4-r12-logit-grid-tie`, rule by rule, on both sides.

Top-20 evidence is produced by the mechanism the seed describes: BF16 logits, promoted to
FP32, torch log_softmax in FP32, values serialized as Python floats (what vLLM returns).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from specpair.admission.evidence import MalformedEvidence, parse_evidence
from specpair.admission.tie_gate import fp32_tolerance, judge
from specpair.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
REG = "pp4-r12-logit-grid-tie"


def bf16_top20(logits: list[float]) -> list[dict]:
    """Top-20 entries (ids 0..19) from 20 BF16-exact logits, FP32 log_softmax over V=64."""
    assert len(logits) == 20
    x = torch.tensor(logits + [min(logits) - 40.0] * 44, dtype=torch.bfloat16)
    assert x[:20].float().tolist() == logits, "logits must be exact BF16 values"
    lp = torch.log_softmax(x.float(), dim=-1)
    return [{"token_id": i, "logprob": float(lp[i])} for i in range(20)]


def ladder(base: float, step: float, margin_steps: int = 1) -> list[float]:
    """Experiment token 0 at the top, reference token 1 `margin_steps` below, a grid below."""
    rest = [base - step * (margin_steps + 1 + j // 2) for j in range(18)]
    return [base, base - step * margin_steps] + rest


def divergence(top20: list[dict] | None, ref: int = 1, exp: int = 0) -> dict:
    return {"index": 40, "reference_token_id": ref, "experiment_token_id": exp, "top20": top20}


def window(*divs: dict | None, prompt_count: int | None = None, counts=(128, 128)) -> dict:
    prompts = [{"prompt": i, "reference_token_count": counts[0],
                "experiment_token_count": counts[1], "divergence": d}
               for i, d in enumerate(divs)]
    return {"registration": REG, "prompt_count": prompt_count or len(divs), "prompts": prompts}


def verdict(ev: dict):
    return judge(parse_evidence(json.loads(json.dumps(ev))))


def reasons(ev: dict) -> str:
    return " | ".join(verdict(ev).reasons)


GOOD = divergence(bf16_top20(ladder(100.0, 0.5)))  # binade [64, 128): step 0.5, margin 1 step


def test_a_good_window_qualifies_and_saves_the_derived_values():
    v = verdict(window(GOOD, None, None))
    assert v.qualified and v.verdict == "QUALIFIED" and v.reasons == ()
    p = v.prompts[0]
    assert p.divergent and p.step == 0.5 and p.margin_steps == 1
    assert p.experiment_to_top_gap == 0.0
    assert abs(p.margin_nats - 0.5) <= fp32_tolerance(0.5, 1.0)
    assert p.max_residual_over_tolerance <= 0.5
    assert [q.divergent for q in v.prompts] == [True, False, False]


# -- the seed document's cases ------------------------------------------------------------

def test_seed_admission_B_greedy_is_not_qualified():
    """Margins 0.0 / 0.5 / 1.0, better-token gap 0.0, no top-20 saved, prompts 3-5 unchecked."""
    ev = json.loads((FIXTURES / "pp4_admission_B_greedy.json").read_text())
    v = verdict(ev)
    assert v.verdict == "NOT QUALIFIED"
    assert [d["reported_margin_nats"] for d in (p["divergence"] for p in ev["prompts"])] == [
        0.0, 0.5, 1.0]
    assert "prompts 3, 4, 5 were never checked" in v.reasons
    for i in range(3):
        assert f"prompt {i}: no top-20 evidence (no ids or unrounded values were saved)" in \
            v.reasons
    # even had prompts 3-5 been checked and identical, the missing top-20 alone stops it
    ev["prompt_count"] = 3
    v = verdict(ev)
    assert not v.qualified and len(v.reasons) == 3
    assert all("no top-20 evidence" in r for r in v.reasons)


@pytest.mark.parametrize("margin, base, step, qualified", [
    (0.0, 100.0, 0.5, True),    # exact tie: 0 steps
    (0.5, 100.0, 0.5, True),    # one step of 0.5
    (1.0, 200.0, 1.0, True),    # one step of 1 (binade [128, 256))
    (0.5, 50.0, 0.25, False),   # two steps of 0.25
    (1.0, 100.0, 0.5, False),   # two steps of 0.5
])
def test_seed_margins_with_synthetic_top20(margin, base, step, qualified):
    n = round(margin / step)
    v = verdict(window(divergence(bf16_top20(ladder(base, step, n)))))
    assert v.qualified is qualified, v.reasons
    if not qualified:
        assert f"is {n} observable steps" in " ".join(v.reasons)


# -- every rule, both sides ---------------------------------------------------------------

def test_rule_registration():
    ev = window(GOOD)
    assert verdict(ev).qualified
    ev["registration"] = "nbw-greedy"
    assert "decides new PP4 experiments only" in reasons(ev)


def test_rule_every_prompt_checked():
    assert verdict(window(GOOD, None, prompt_count=2)).qualified
    assert "prompts 2 were never checked" in reasons(window(GOOD, None, prompt_count=3))


def test_rule_at_most_three_divergent_prompts():
    assert verdict(window(GOOD, GOOD, GOOD, None)).qualified
    assert "4 divergent prompts (at most 3)" in reasons(window(GOOD, GOOD, GOOD, GOOD))


def test_rule_equal_token_lengths():
    assert verdict(window(GOOD, None, counts=(90, 90))).qualified
    r = reasons(window(GOOD, None, counts=(90, 91)))
    assert "prompt 0: token lengths differ" in r and "prompt 1: token lengths differ" in r


def _with(top: list[dict], i: int, logprob: float) -> list[dict]:
    out = copy.deepcopy(top)
    out[i]["logprob"] = logprob
    return out


TOP = GOOD["top20"]


@pytest.mark.parametrize("top20, message", [
    (None, "no top-20 evidence"),
    (TOP[:19], "has 19 entries, not 20"),
    (TOP + [{"token_id": 63, "logprob": -40.0}], "has 21 entries"),
    ([*TOP[:19], {"token_id": 0, "logprob": TOP[19]["logprob"]}], "token ids repeat"),
    (_with(TOP, 7, float("nan")), "non-finite log-prob nan"),
    (_with(TOP, 7, float("-inf")), "non-finite log-prob -inf"),
    (_with(TOP, 19, -9999.0), "clamped log-prob -9999.0"),
    (_with(TOP, 19, -10000.5), "clamped log-prob"),
    (_with(TOP, 0, 0.25), "positive log-prob"),
    (_with(TOP, 5, round(TOP[5]["logprob"], 4)), "is not an FP32 value"),
])
def test_rule_top20_evidence_is_complete_finite_unclamped_fp32(top20, message):
    assert message in reasons(window(divergence(top20)))


def test_rule_top20_evidence_good_side_just_above_the_clamp():
    # explicitly synthetic FP32 values on a 0.5 grid; the last sits just above vLLM's -9999
    values = [-1.0, -1.5] + [-2.0 - 0.5 * j for j in range(17)] + [-9998.5]
    top = [{"token_id": i, "logprob": v} for i, v in enumerate(values)]
    assert verdict(window(divergence(top))).qualified


def test_rule_both_compared_tokens_in_top20():
    assert verdict(window(divergence(TOP, ref=1, exp=0))).qualified
    assert "reference token 40 is not in the top-20" in reasons(
        window(divergence(TOP, ref=40, exp=0)))
    assert "experiment token 41 is not in the top-20" in reasons(
        window(divergence(TOP, ref=1, exp=41)))
    assert "no divergence" in reasons(window(divergence(TOP, ref=0, exp=0)))


def test_rule_experiment_token_at_the_top():
    # ties at the top are "at the top": experiment 0 and reference 1 both at 100.0
    tie = divergence(bf16_top20(ladder(100.0, 0.5, 0)))
    assert verdict(window(tie)).qualified
    # experiment one step below the top (the reference is the top): the NBW gap that used the
    # BETTER token would read 0.0 here; the gate uses the experiment's own gap
    below = divergence(TOP, ref=0, exp=1)
    r = reasons(window(below))
    assert "experiment token is not at the top (gap 0.5" in r


def test_rule_smallest_gap_is_a_power_of_two_at_most_one():
    # three BF16 steps of 0.25 between every neighbour: smallest gap 0.75, never rescued by GCD
    off = [50.0 - 0.75 * (j // 2) for j in range(20)]
    r = reasons(window(divergence(bf16_top20(off))))
    assert "smallest positive top-20 gap 0.7499998" in r and "is not a power of two" in r
    # binade [256, 512): BF16 step 2 > 1
    assert "is a step above 1" in reasons(window(divergence(bf16_top20(ladder(300.0, 2.0)))))
    # good side, smallest steps: 2^-4 in [8, 16), 2^-7 in [1, 2)
    assert verdict(window(divergence(bf16_top20(ladder(12.0, 2.0 ** -4))))).qualified
    assert verdict(window(divergence(bf16_top20(ladder(1.5, 2.0 ** -7))))).qualified


def test_rule_an_all_equal_set_has_no_grid():
    r = reasons(window(divergence(bf16_top20([100.0] * 20))))
    assert "all top-20 log-probs are equal" in r


def test_rule_every_gap_a_multiple_within_fp32_error():
    top = copy.deepcopy(TOP)
    v = top[12]["logprob"]
    ulp = float(torch.finfo(torch.float32).eps) * 2.0 ** math.floor(math.log2(abs(v)))
    # one ulp off: inside ulp(a) + ulp(b) for every pair that includes it
    top[12]["logprob"] = float(torch.tensor(v - ulp, dtype=torch.float32))
    assert verdict(window(divergence(top))).qualified
    # four ulps off a tied partner: a real gap of 2^-19, itself a power of two, so the
    # observable step becomes 2^-19 and the 0.5-nat margin is 262144 steps: still a STOP
    top[12]["logprob"] = float(torch.tensor(v - 4 * ulp, dtype=torch.float32))
    r = reasons(window(divergence(top)))
    assert "is 262144 observable steps of 1.9073486328125e-06" in r
    # off-grid by 0.3 steps while the smallest gap stays 0.5: the multiples rule stops it
    top = copy.deepcopy(TOP)
    low = min(e["logprob"] for e in top[:19])
    top[19]["logprob"] = float(torch.tensor(low - 0.8, dtype=torch.float32))
    r = reasons(window(divergence(top)))
    assert "of 190 top-20 gaps are not integer multiples of the step 0.5" in r
    assert verdict(window(divergence(top))).prompts[0].step == 0.5


def test_rule_at_most_one_observable_step():
    assert verdict(window(divergence(bf16_top20(ladder(100.0, 0.5, 1))))).qualified
    r = reasons(window(divergence(bf16_top20(ladder(100.0, 0.5, 2)))))
    assert "nats is 2 observable steps of 0.5 (at most one allowed)" in r


def test_rule_ceiling_of_1_1_nats():
    # one step of 1.0 nat sits under the ceiling
    assert verdict(window(divergence(bf16_top20(ladder(200.0, 1.0, 1))))).qualified
    # 1.5 nats (three steps of 0.5) breaks the ceiling, and the one-step rule with it: with a
    # step <= 1, one step never exceeds 1.1 nats, so the ceiling never fires alone
    r = reasons(window(divergence(bf16_top20(ladder(100.0, 0.5, 3)))))
    assert "exceeds the 1.1-nat ceiling" in r and "3 observable steps" in r


# -- the FP32 tolerance against the real mechanism ----------------------------------------

def test_fp32_log_softmax_gap_error_stays_within_half_the_tolerance():
    """Random BF16 logits, FP32 log_softmax: |(lp_i - lp_j) - (x_i - x_j)| over every top-20
    pair stays <= 0.5 * (ulp(lp_i) + ulp(lp_j)), so the gate's tolerance has a 2x margin, and
    errors do occur (the tolerance is needed)."""
    g = torch.Generator().manual_seed(7)
    worst, nonzero = 0.0, 0
    for _ in range(60):
        base = float(torch.randint(1, 400, (1,), generator=g))
        v = int(torch.randint(25, 3000, (1,), generator=g))
        scale = float(torch.rand(1, generator=g)) * 4
        x = (base + torch.randn(v, generator=g) * scale).to(torch.bfloat16).float()
        lp = torch.log_softmax(x, dim=-1)
        vals, ids = lp.topk(20)
        xs = x[ids].double()
        vals64 = vals.double()
        err = ((vals64[:, None] - vals64[None, :]) - (xs[:, None] - xs[None, :])).abs()
        tol = torch.tensor([[fp32_tolerance(float(a), float(b)) for b in vals] for a in vals],
                           dtype=torch.float64)
        worst = max(worst, float((err / tol).max()))
        nonzero += int((err > 0).sum())
    assert nonzero > 0
    assert worst <= 0.5


# -- malformed input and the CLI ----------------------------------------------------------

@pytest.mark.parametrize("mutate, message", [
    (lambda e: e.pop("prompt_count"), "missing keys \\['prompt_count'\\]"),
    (lambda e: e["prompts"][0].update(extra=1), "unknown keys \\['extra'\\]"),
    (lambda e: e["prompts"][0]["divergence"]["top20"][3].update(logprob="-1.5"),
     "top20\\[3\\].logprob: expected a number"),
    (lambda e: e["prompts"][0]["divergence"].update(top20={"0": -1.0}), "expected a list"),
    (lambda e: e["prompts"][0].update(prompt=1), "prompt numbers repeat"),
    (lambda e: e["prompts"][1].update(prompt=7), "exceed prompt_count"),
    (lambda e: e["prompts"][0].update(reference_token_count=-3), "integer >= 0"),
])
def test_malformed_evidence_is_refused(mutate, message):
    ev = window(copy.deepcopy(GOOD), None)
    mutate(ev)
    with pytest.raises(MalformedEvidence, match=message):
        parse_evidence(ev)


def test_cli_verdicts_and_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(window(GOOD, None)))
    assert main(["admission", "tie-gate", str(good), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "QUALIFIED" and out["stop"] is False and out["ceiling_nats"] == 1.1
    assert out["prompts"][0]["step"] == 0.5
    seed = FIXTURES / "pp4_admission_B_greedy.json"
    assert main(["admission", "tie-gate", str(seed), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "NOT QUALIFIED" and out["stop"] is True
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["admission", "tie-gate", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "NOT QUALIFIED" and "malformed evidence refused" in out["reasons"][0]
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(window(divergence(_with(TOP, 3, float("nan"))))))
    assert main(["admission", "tie-gate", str(nan)]) == 1
    assert "non-finite log-prob nan" in capsys.readouterr().out
