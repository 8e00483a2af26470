"""The live benchmark's outputs: the document behind build/bench/live.json (rows with the speed
model's prediction beside each), the printed table and the PNG."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.live.model import FLAG, predict
from bench.live.paired import (
    BEST,
    BEST_ROW,
    paired_cells,
    paired_summaries,
    paired_table,
    twin_pairs,
)
from bench.live.plan import ACCEPTANCE, OFF_TWIN, TWIN, configs
from bench.live.rows import assemble, check_rows

__all__ = ["document", "plot", "round_split", "table"]


def _key(r: dict) -> tuple:
    return r["workload"], r["temperature"], r["top_p"]


def _medians(rows: list[dict], config: str) -> dict[tuple, dict[int, float]]:
    out: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r["config"] == config:
            out.setdefault(_key(r), {})[r["concurrency"]] = r["tokens_per_s"]["median"]
    return out


def _order(rows: list[dict]) -> list[dict]:
    """A cell's rows together (workload, sampling, concurrency), in the plan's engine order
    (target-only first, the twins last)."""
    names = [c.name for c in configs(True)] + [TWIN, OFF_TWIN]

    def key(r: dict) -> tuple:
        rank = names.index(r["config"]) if r["config"] in names else len(names)
        return (r["workload"], r["temperature"], -r["top_p"], r["concurrency"], rank,
                r["config"])

    return sorted(rows, key=key)


def document(measurements: list[dict], calibration_configs: set[str], meta: dict,
             q_s: dict[str, float], versus: tuple[tuple[str, str], ...] = ()) -> dict:
    """live.json: ``rows`` (one per config x workload x temperature x top_p x concurrency,
    each with ``model``: the speed model's prediction, or None where a part is missing),
    ``calibration`` (the draft-alone rows), ``paired`` (a list: the adaptive row over its
    twin, then over the best other row of each cell, per repetition (BEST) and the cell's
    fastest row (BEST_ROW), where others ran beside it, then
    each (row, baseline) of ``versus``, per repetition with bootstrap intervals,
    bench.live.paired; then, at T > 0, specpair's sampled drafts over its greedy ones in
    accepted drafts per round, ``ACCEPTANCE``), ``meta``."""
    rows = _order(assemble(measurements))
    check_rows(rows)
    target, alone = _medians(rows, "target_only"), _medians(rows, "draft_alone")
    for r in rows:
        r["model"] = predict(r, target.get(_key(r), {}), alone.get(_key(r)), q_s)
    meta = {**meta, "q_build_s": q_s, "flag_above": FLAG}
    return {"meta": meta, "rows": [r for r in rows if r["config"] not in calibration_configs],
            "calibration": [r for r in rows if r["config"] in calibration_configs],
            "paired": paired_summaries(paired_cells(
                measurements, twin_pairs(measurements) + _best(measurements) + list(versus),
                exclude=frozenset(calibration_configs)) + [
                c for c in paired_cells(measurements, list(ACCEPTANCE), "accepted_per_round")
                if c["temperature"] > 0])}


def _best(measurements: list[dict]) -> list[tuple[str, str]]:
    """(the adaptive row, BEST) and (the adaptive row, BEST_ROW) where the adaptive engine ran
    beside other engines."""
    ran = {m["config"] for m in measurements}
    adaptive = "specpair_adaptive"
    if adaptive in ran and len(ran - {adaptive, TWIN}) > 0:
        return [(adaptive, BEST), (adaptive, BEST_ROW)]
    return []


def _sampling(r: dict) -> str:
    return f"T={r['temperature']:g}" + (f" p={r['top_p']:g}" if r["top_p"] < 1 else "")


def _rng(s: dict | None, fmt: str) -> str:
    if s is None:
        return "-"
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def table(doc: dict) -> str:
    """The rows as a fixed-width table; '!' marks a prediction more than FLAG off; rnd p99:
    specpair's round time (PROPOSE to PROPOSAL), the histogram bound at or under which 99 % of
    the rounds took, ms."""
    head = (f"{'config':<19} {'workload':<8} {'sampling':<10} {'c':>2} "
            f"{'tok/s median [min-max]':<24} {'x target-only':<19} {'acc/rnd':>7} "
            f"{'model tok/s':>11} {'gap':>6} {'rnd p99':>7}")
    lines = [head, "-" * len(head)]
    for r in doc["rows"] + doc["calibration"]:
        m = r["model"]
        acc = "-" if r["accepted_per_round"] is None else f"{r['accepted_per_round']:.2f}"
        pred = "-" if m is None else f"{m['predicted_tokens_per_s']:.0f}"
        gap = "-" if m is None else f"{m['gap']:+.0%}" + ("!" if m["flagged"] else "")
        p99 = r.get("round_p99_s")  # an upper bucket bound, ms; specpair rows only
        p99 = "-" if p99 is None else f"{p99 * 1e3:.3g}"
        lines.append(f"{r['config']:<19} {r['workload']:<8} {_sampling(r):<10} "
                     f"{r['concurrency']:>2} {_rng(r['tokens_per_s'], '.0f'):<24} "
                     f"{_rng(r['ratio_vs_target_only'], '.2f'):<19} {acc:>7} {pred:>11} "
                     f"{gap:>6} {p99:>7}")
    lines += ["", *round_split(doc["rows"])]
    for summary in doc.get("paired", []):
        lines += ["", paired_table(summary)]
    return "\n".join(lines)


def round_split(rows: list[dict]) -> list[str]:
    """Where specpair's PROPOSE round goes, per config and concurrency over its cells: the
    round as the target times it (``specpair_round_seconds``), the drafter's own handling of
    it (``specpair_drafter_round_seconds``: the draft forward, sampling, q), and the rest
    (the wire both ways, the processes' reads and wake-ups, the drafter server's hops), mean
    ms a round."""
    sums: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        c = r["counters"]
        if c.get("round_s_count") and c.get("drafter_s_count"):
            s = sums.setdefault((r["config"], r["concurrency"]), [0.0] * 4)
            for i, k in enumerate(("round_s_sum", "round_s_count", "drafter_s_sum",
                                   "drafter_s_count")):
                s[i] += c[k]
    if not sums:
        return []
    head = (f"{'round, mean ms':<19} {'c':>2} {'rounds':>7} {'round':>6} {'drafter':>7} "
            f"{'rest':>6}")
    lines = [head, "-" * len(head)]
    for (config, conc), (rs, rn, ds, dn) in sorted(sums.items(), key=lambda kv: kv[0][::-1]):
        rnd, drafter = 1e3 * rs / rn, 1e3 * ds / dn
        lines.append(f"{config:<19} {conc:>2} {rn:>7.0f} {rnd:>6.2f} {drafter:>7.2f} "
                     f"{rnd - drafter:>6.2f}")
    return lines


def plot(doc: dict, path: Path) -> None:
    """Tokens/s (median, min-max bars) of every row; acceptance per position by config and
    sampling setting (mean over workloads and concurrencies)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(16, max(6, 0.22 * len(rows))),
                                  gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"{r['config']} {r['workload']} {_sampling(r)} c={r['concurrency']}"
              for r in rows]
    med = [r["tokens_per_s"]["median"] for r in rows]
    lo = [r["tokens_per_s"]["median"] - r["tokens_per_s"]["min"] for r in rows]
    hi = [r["tokens_per_s"]["max"] - r["tokens_per_s"]["median"] for r in rows]
    ax.barh(range(len(rows)), med, xerr=[lo, hi], capsize=2)
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")  # target-only and a slow speculator differ by orders of magnitude
    ax.set_xlabel("decode tokens/s (median, min-max; log scale), prefill excluded")
    groups: dict[tuple[str, str], list[list[float]]] = {}
    for r in rows:
        if r["accepted_per_position"]:
            groups.setdefault((r["config"], _sampling(r)), []).append(r["accepted_per_position"])
    for (config, sampling), curves in groups.items():
        n = min(len(c) for c in curves)
        mean = [statistics.fmean(c[k] for c in curves) for k in range(n)]
        ax2.plot(range(1, n + 1), mean, marker="o", label=f"{config} {sampling}")
    ax2.set_xlabel("draft position k")
    ax2.set_ylabel("share of rounds accepted up to k")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7)
    fig.suptitle(doc["meta"].get("title", "make bench-live"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
