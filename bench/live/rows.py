"""From raw measurements to the rows of build/bench/live.json (pure: no processes, no clock).

A measurement is one repetition of one cell in one engine: a dict with ``config``,
``workload``, ``temperature``, ``top_p``, ``concurrency``, ``rep``, ``tokens_per_s`` (decode
tokens per second over the cell's concurrent streams: their tokens after the first over their
mean decode time, first token to last by the engine core's timestamps, vLLM's
``vllm:request_decode_time_seconds``; prefill excluded; under steady arrivals, by the client's
chunk times, bench.live.run), ``stream_tokens_per_s`` (the same from the client's chunk
arrival times, a cross-check that a starved client or API server distorts; None where a stream
came in one chunk), ``decode_tokens`` (the tokens after the first of every request of the
turn, summed), ``counters`` (the change of vLLM's spec-decode counters, its decode-time sums
and specpair's round-time sums over the measurement, ``bench.live.client.SPEC_COUNTERS``),
``twin_of`` (the config whose engine ran it with the requests' own depth policy pinned, or
None: bench.live.plan's twin) and ``in_flight`` (under steady arrivals the share of c
requests in flight while the measured ones decoded, bench.live.client.in_flight; else None or
absent).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from bench.live.client import round_quantile

__all__ = ["ROW_FIELDS", "assemble", "check_rows", "counter_delta", "summary"]

TARGET = "target_only"
# Every row has these; ratio_vs_target_only, ratio_vs_twin and the acceptance fields are None
# where they do not apply (target-only; an engine without drafts; a row without a twin).
ROW_FIELDS = ("config", "workload", "temperature", "top_p", "concurrency", "tokens_per_s",
              "ratio_vs_target_only", "ratio_vs_twin", "twin_of", "accepted_per_round",
              "accepted_per_position", "draft_tokens_per_round", "steps", "counters", "reps")


def summary(values: list[float]) -> dict[str, float]:
    """median, min and max of a non-empty list."""
    if not values:
        raise ValueError("no values to summarize")
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def counter_delta(before: dict, after: dict) -> dict:
    """after - before, per counter (``per_pos`` elementwise); counters ``after`` lacks are
    left out, and one ``before`` lacks counts from 0 (it appeared with the first draft)."""
    out: dict = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, list):
            old = old or []
            out[key] = [v - (old[i] if i < len(old) else 0.0) for i, v in enumerate(value)]
        else:
            out[key] = value - (old or 0.0)
    return out


def _sum_counters(ms: list[dict]) -> dict:
    total: dict = {}
    for m in ms:
        for key, value in m["counters"].items():
            if isinstance(value, list):
                have = total.setdefault(key, [])
                have.extend([0.0] * (len(value) - len(have)))
                for i, v in enumerate(value):
                    have[i] += v
            else:
                total[key] = total.get(key, 0.0) + value
    return total


def _cell(m: dict) -> tuple:
    return m["workload"], m["temperature"], m["top_p"], m["concurrency"]


def _ratios(ms: list[dict], ref: dict[int, list[float]]) -> dict[str, float] | None:
    """Each measurement's tokens/s over the mean of ``ref``'s values in its repetition."""
    ratios = [m["tokens_per_s"] / statistics.fmean(ref[m["rep"]]) for m in ms
              if ref.get(m["rep"])]
    return summary(ratios) if ratios else None


def assemble(measurements: list[dict]) -> list[dict]:
    """One row per (config, workload, temperature, top_p, concurrency), in first-seen order.

    Ratios: per repetition r, the row's tokens/s over target-only's value in repetition r
    of the same cell (the mean, were there several); the row reports their
    median, min and max. ``ratio_vs_twin``, likewise, over its twin's value in repetition r
    (the same engine, pinned requests). Acceptance: from the counters summed over the repetitions:
    accepted drafts per drafting round (vLLM's num_drafts), per position the share of rounds
    whose drafts were accepted up to it, draft tokens per round, and the decode steps
    (tokens decoded minus drafts accepted: each step yields one token plus its accepted
    drafts)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for m in measurements:
        groups[(m["config"], *_cell(m))].append(m)
    base: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    twins: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        if m["config"] == TARGET:
            base[_cell(m)][m["rep"]].append(m["tokens_per_s"])
        if m.get("twin_of"):
            twins[(m["twin_of"], *_cell(m))][m["rep"]].append(m["tokens_per_s"])
    rows = []
    for (config, workload, temperature, top_p, conc), ms in groups.items():
        ratio = None
        if config != TARGET:
            ratio = _ratios(ms, base.get((workload, temperature, top_p, conc), {}))
        twin_ratio = _ratios(ms, twins.get((config, workload, temperature, top_p, conc), {}))
        c = _sum_counters(ms)
        decoded = sum(m["decode_tokens"] for m in ms)
        drafts = c.get("drafts", 0.0)
        accepted = c.get("accepted", 0.0)
        rows.append({
            "config": config, "workload": workload, "temperature": temperature,
            "top_p": top_p, "concurrency": conc,
            "tokens_per_s": summary([m["tokens_per_s"] for m in ms]),
            "ratio_vs_target_only": ratio, "ratio_vs_twin": twin_ratio,
            "twin_of": ms[0].get("twin_of"),
            "accepted_per_round": accepted / drafts if drafts else None,
            "accepted_per_position": [a / drafts for a in c["per_pos"]]
            if drafts and c.get("per_pos") else None,
            "draft_tokens_per_round": c["draft_tokens"] / drafts if drafts else None,
            "steps": decoded - accepted,
            "round_p99_s": round_quantile(c["round_le"], 0.99) if c.get("round_le") else None,
            "counters": c, "reps": len(ms),
            "in_flight": summary([m["in_flight"] for m in ms])
            if all(m.get("in_flight") is not None for m in ms) else None,
        })
    return rows


def check_rows(rows: list[dict]) -> None:
    """Raise ValueError naming the first row that breaks live.json's schema."""
    with_target = any(r.get("config") == TARGET for r in rows)
    for i, r in enumerate(rows):
        missing = [f for f in ROW_FIELDS if f not in r]
        if missing:
            raise ValueError(f"row {i} lacks {', '.join(missing)}")
        t = r["tokens_per_s"]
        if not (isinstance(t, dict) and set(t) >= {"median", "min", "max"}
                and t["min"] <= t["median"] <= t["max"]):
            raise ValueError(f"row {i} ({r['config']}): tokens_per_s is not median/min/max")
        ratio = r["ratio_vs_target_only"]
        if (r["config"] == TARGET) != (ratio is None) and (ratio is not None or with_target):
            raise ValueError(f"row {i} ({r['config']}): ratio_vs_target_only must be null "
                             "exactly for target-only rows (and every row's, in a run "
                             "without target-only)")
        if r["concurrency"] < 1 or r["temperature"] < 0 or not 0 < r["top_p"] <= 1:
            raise ValueError(f"row {i} ({r['config']}): concurrency/temperature/top_p "
                             "out of range")
        a = r["accepted_per_round"]
        if a is not None and not 0 <= a <= (r["draft_tokens_per_round"] or 0):
            raise ValueError(f"row {i} ({r['config']}): accepted_per_round outside "
                             "[0, draft tokens per round]")
