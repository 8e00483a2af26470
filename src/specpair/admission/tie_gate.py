"""The greedy near-tie gate, registration ``pp4-r12-logit-grid-tie`` (PP4 Round 12).

A greedy experiment may differ from the greedy reference only where the two
compared tokens are a BF16 near-tie: the head's logits are BF16 (8 significant
bits), so log-prob differences sit on a grid of binary steps, and FP32
log-softmax exposes them up to FP32 rounding. For NEW PP4 experiments only, a
window QUALIFIES when, and only when:

1. registration is ``pp4-r12-logit-grid-tie`` (NBW, TV1 and W8 keep their rules);
2. every prompt of the window was checked (prompt_count of them);
3. at most three prompts diverge;
4. every prompt's two outputs have equal token lengths;
5. every divergent prompt has top-20 evidence: exactly 20 entries, distinct ids,
   values finite, unclamped (vLLM clamps below -9999), FP32 values, <= 0;
6. both compared tokens (reference and experiment) are in that top-20;
7. the experiment token is at the top (experiment-to-top gap 0 within FP32
   subtraction error);
8. the smallest positive top-20 gap is a binary power of two <= 1 (the
   observable step); an all-equal set has no step and STOPs;
9. EVERY pairwise top-20 gap is an integer multiple of that step within FP32
   subtraction error;
10. the experiment-reference margin is at most one observable step;
11. the margin is at most 1.1 nats (the PP4 admission's registered ceiling).

Never: a fine GCD to rescue an off-grid set, a tolerance widened from the
divergent margin, a grid inferred from an all-equal set. Sparse or mixed-binade
evidence may STOP: that is conservative, by design. Every failure is a STOP
before measurement.

FP32 subtraction error: each serialized log-prob is one FP32 rounding of an
exact value (half an ulp); a difference of two carries at most half an ulp of
each. The gate allows ulp(a) + ulp(b), twice that bound, and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from specpair.admission.evidence import Divergence, TieEvidence

__all__ = ["REGISTRATION", "CEILING_NATS", "MAX_DIVERGENT", "TOP_N", "CLAMP", "PromptResult",
           "TieVerdict", "fp32_tolerance", "judge", "judge_divergence"]

REGISTRATION = "pp4-r12-logit-grid-tie"
CEILING_NATS = 1.1  # the PP4 admission's registered margin ceiling
MAX_DIVERGENT = 3  # at most three divergent prompts
TOP_N = 20  # top-20 evidence
CLAMP = -9999.0  # vLLM serializes log-probs clamped at this floor


@dataclass(frozen=True)
class PromptResult:
    """What the gate derived for one prompt (the values Round 12 says to save)."""

    prompt: int  # prompt number
    divergent: bool  # outputs differ
    reference_token_count: int  # tokens of the reference output
    experiment_token_count: int  # tokens of the experiment output
    experiment_to_top_gap: float | None  # top log-prob minus the experiment token's
    step: float | None  # the observable step (smallest positive gap, a power of two)
    margin_nats: float | None  # experiment minus reference log-prob
    margin_steps: int | None  # margin in steps (rounded)
    max_residual: float | None  # largest |gap - n * step| over all pairs
    max_residual_over_tolerance: float | None  # the same, divided by that pair's tolerance
    reasons: tuple[str, ...]  # why this prompt stops the window (empty: it passes)


@dataclass(frozen=True)
class TieVerdict:
    """The gate's verdict on a window."""

    gate: str  # REGISTRATION
    qualified: bool  # True: QUALIFIED; False: NOT QUALIFIED (STOP)
    reasons: tuple[str, ...]  # every reason it stops (empty when qualified)
    prompts: tuple[PromptResult, ...]  # per checked prompt

    @property
    def verdict(self) -> str:
        return "QUALIFIED" if self.qualified else "NOT QUALIFIED"


def fp32_tolerance(a: float, b: float) -> float:
    """The FP32 subtraction error allowed on a - b: ulp(a) + ulp(b) at FP32."""
    return float(np.spacing(np.float32(abs(a)))) + float(np.spacing(np.float32(abs(b))))


def _value_problems(d: Divergence) -> list[str]:
    top = d.top20
    assert top is not None
    out = []
    if len(top) != TOP_N:
        out.append(f"top-20 evidence has {len(top)} entries, not {TOP_N}")
    ids = [e.token_id for e in top]
    if len(set(ids)) != len(ids):
        out.append("top-20 token ids repeat")
    for e in top:
        v = e.logprob
        if not math.isfinite(v):
            out.append(f"non-finite log-prob {v} (token {e.token_id})")
        elif v <= CLAMP:
            out.append(f"clamped log-prob {v} (token {e.token_id}; vLLM clamps at {CLAMP})")
        elif v > 0:
            out.append(f"positive log-prob {v} (token {e.token_id})")
        elif float(np.float32(v)) != v:
            out.append(f"log-prob {v!r} (token {e.token_id}) is not an FP32 value "
                       "(rounded or recomputed evidence)")
    if d.reference_token_id == d.experiment_token_id:
        out.append("reference and experiment tokens are the same id: no divergence")
    return out


def judge_divergence(d: Divergence) -> tuple[list[str], dict[str, float | int | None]]:
    """Rules 5-11 on one divergent prompt: (reasons, derived values)."""
    derived: dict[str, float | int | None] = dict(
        experiment_to_top_gap=None, step=None, margin_nats=None, margin_steps=None,
        max_residual=None, max_residual_over_tolerance=None)
    if d.top20 is None:
        return ["no top-20 evidence (no ids or unrounded values were saved)"], derived
    problems = _value_problems(d)
    if problems:
        return problems, derived
    lp = {e.token_id: e.logprob for e in d.top20}
    reasons = [f"{who} token {tid} is not in the top-20"
               for who, tid in (("reference", d.reference_token_id),
                                ("experiment", d.experiment_token_id)) if tid not in lp]
    values = sorted(lp.values(), reverse=True)
    top = values[0]
    if d.experiment_token_id in lp:
        e = lp[d.experiment_token_id]
        derived["experiment_to_top_gap"] = top - e
        if top - e > fp32_tolerance(top, e):
            reasons.append(f"experiment token is not at the top (gap {top - e!r} nats)")
    pairs = [(abs(a - b), fp32_tolerance(a, b)) for a, b in combinations(values, 2)]
    positive = [(g, t) for g, t in pairs if g > t]
    if not positive:
        reasons.append("all top-20 log-probs are equal: no grid step can be observed")
        return reasons, derived
    g, t = min(positive)
    step = 2.0 ** round(math.log2(g))
    if abs(g - step) > t:
        reasons.append(f"smallest positive top-20 gap {g!r} is not a power of two")
        return reasons, derived
    if step > 1:
        reasons.append(f"smallest positive top-20 gap {g!r} is a step above 1")
        return reasons, derived
    derived["step"] = step
    residuals = [(abs(gap - round(gap / step) * step), tol) for gap, tol in pairs]
    worst = max(residuals, key=lambda rt: rt[0] / rt[1])
    derived["max_residual"] = max(r for r, _ in residuals)
    derived["max_residual_over_tolerance"] = worst[0] / worst[1]
    off = sum(1 for r, tol in residuals if r > tol)
    if off:
        reasons.append(f"{off} of {len(pairs)} top-20 gaps are not integer multiples of the "
                       f"step {step!r} within FP32 subtraction error (worst residual "
                       f"{worst[0]:.3g} vs tolerance {worst[1]:.3g})")
    if d.experiment_token_id in lp and d.reference_token_id in lp:
        margin = lp[d.experiment_token_id] - lp[d.reference_token_id]
        n = round(margin / step)
        derived["margin_nats"], derived["margin_steps"] = margin, n
        if n > 1:
            reasons.append(f"margin {margin!r} nats is {n} observable steps of {step!r} "
                           "(at most one allowed)")
        if margin > CEILING_NATS:
            reasons.append(f"margin {margin!r} nats exceeds the {CEILING_NATS}-nat ceiling")
    return reasons, derived


def judge(ev: TieEvidence) -> TieVerdict:
    """The verdict on a whole window (rules 1-11)."""
    reasons = []
    if ev.registration != REGISTRATION:
        reasons.append(f"registration {ev.registration!r} is not {REGISTRATION!r}: this gate "
                       "decides new PP4 experiments only (NBW, TV1, W8 keep their rules)")
    unchecked = sorted(set(range(ev.prompt_count)) - {p.prompt for p in ev.prompts})
    if unchecked:
        reasons.append(f"prompts {', '.join(map(str, unchecked))} were never checked")
    divergent = [p for p in ev.prompts if p.divergence is not None]
    if len(divergent) > MAX_DIVERGENT:
        reasons.append(f"{len(divergent)} divergent prompts (at most {MAX_DIVERGENT})")
    results = []
    for p in sorted(ev.prompts, key=lambda p: p.prompt):
        own: list[str] = []
        if p.reference_token_count != p.experiment_token_count:
            own.append(f"token lengths differ: reference {p.reference_token_count}, "
                       f"experiment {p.experiment_token_count}")
        derived: dict[str, float | int | None] = dict(
            experiment_to_top_gap=None, step=None, margin_nats=None, margin_steps=None,
            max_residual=None, max_residual_over_tolerance=None)
        if p.divergence is not None:
            more, derived = judge_divergence(p.divergence)
            own += more
        results.append(PromptResult(p.prompt, p.divergence is not None,
                                    p.reference_token_count, p.experiment_token_count,
                                    reasons=tuple(own), **derived))
        reasons += [f"prompt {p.prompt}: {r}" for r in own]
    return TieVerdict(REGISTRATION, not reasons, tuple(reasons), tuple(results))
