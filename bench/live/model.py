"""The speed model: predicted decode tokens/s of each row from its parts (pure arithmetic).

Leviathan et al. 2023 section 3.3: speculative decoding's speed is the expected tokens per
round over the round's time. Per stream and engine step here:

    tokens per step  E = 1 + f * sum_k a_k
        a_k: the share of drafting rounds whose drafts were accepted up to position k
        (vLLM's per-position counters over num_drafts), f: the share of steps that drafted
        (1 for draft_model and specpair; below 1 for ngram, which proposes only on a match);
    step time        t = verify(c * (1 + D)) + draft + wire + q
        verify(n): the target's step over n query tokens (c streams, D draft tokens per
        stream-step), from the target-only rows of the same workload and sampling setting:
        verify(1) = 1 / rate(c=1), verify(4) = 4 / rate(c=4) (four streams' tokens in one
        step), linear in n between and beyond (beyond 4 never decreasing);
        draft: specpair: the drafter's own round time (its metrics), wire: specpair's
        target-side round time (PROPOSE sent to PROPOSAL decoded) minus the drafter's;
        vLLM draft_model: K steps of the draft model at the same concurrency, from the
        draft-alone calibration engine; ngram: 0 (a host-side lookup);
        q: specpair's V1 q build (qlaw.probs into the [B, K, V] buffer), measured in
        process (bench.live.costs), per request-round;
    predicted tokens/s = c * E / t.

Target-only rows are the calibration (their prediction is their measurement). A row whose
prediction and median differ by more than ``FLAG`` is flagged; docs/performance.md
("Speed model") says what the model leaves out.
"""

from __future__ import annotations

from bench.live.plan import K

__all__ = ["FLAG", "predict", "verify_s"]

FLAG = 0.15  # |predicted / measured - 1| above this is flagged


def verify_s(n_tokens: float, rate_c1: float, rate_c4: float) -> float:
    """The target's step time over ``n_tokens`` query tokens, linear through the target-only
    step times at 1 token (one stream) and 4 tokens (four streams); beyond 4 tokens at that
    slope only where it is positive: where the four-stream step measured no dearer than the
    one-stream step (a noisy pair of medians), more tokens are not taken to cost less."""
    s1, s4 = 1.0 / rate_c1, 4.0 / rate_c4
    slope = (s4 - s1) / 3.0
    if n_tokens <= 4.0:
        return s1 + (n_tokens - 1.0) * slope
    return s4 + (n_tokens - 4.0) * max(0.0, slope)


def predict(row: dict, target: dict[int, float], draft_alone: dict[int, float] | None,
            q_s: dict[str, float]) -> dict | None:
    """The model's prediction for one row (see the module docstring), or None when a part
    is missing. ``target`` / ``draft_alone``: median tokens/s by concurrency of the same
    workload and sampling setting; ``q_s``: seconds of one request-round's q build by
    drafter mode ("greedy", "sampled")."""
    c, config = row["concurrency"], row["config"]
    measured = row["tokens_per_s"]["median"]
    if 1 not in target or 4 not in target:
        return None
    if config == "target_only":
        step = verify_s(c, target[1], target[4])
        return _result(c, 1.0, {"verify": step}, measured)
    counters, steps = row["counters"], row["steps"]
    drafts = counters.get("drafts", 0.0)
    if steps <= 0 or not drafts:
        return None
    per_pos = row["accepted_per_position"] or []
    share = drafts / steps
    tokens = 1.0 + share * sum(per_pos)
    draft_tokens = counters.get("draft_tokens", 0.0) / steps
    parts = {"verify": verify_s(c * (1.0 + draft_tokens), target[1], target[4])}
    engine_steps = steps / c  # streams step together
    if config.startswith("specpair"):
        n, total = counters.get("round_s_count", 0.0), counters.get("round_s_sum", 0.0)
        dn, dtotal = counters.get("drafter_s_count", 0.0), counters.get("drafter_s_sum", 0.0)
        if not n or not dn:
            return None
        per_step = n / engine_steps  # PROPOSE rounds per engine step (about 1)
        parts["draft"] = dtotal / dn * per_step
        parts["wire"] = max(0.0, total / n - dtotal / dn) * per_step
        parts["q"] = c * q_s["greedy" if config.endswith("greedy") else "sampled"]
    elif config == "vllm_draft_model":
        if not draft_alone or c not in draft_alone:
            return None
        parts["draft"] = K * c / draft_alone[c]
    return _result(c, tokens, parts, measured)


def _result(c: int, tokens: float, parts: dict[str, float], measured: float) -> dict:
    step = sum(parts.values())
    predicted = c * tokens / step
    gap = predicted / measured - 1.0
    return {"predicted_tokens_per_s": predicted, "gap": gap, "flagged": abs(gap) > FLAG,
            "tokens_per_step": tokens, "step_ms": {k: v * 1e3 for k, v in parts.items()}}
