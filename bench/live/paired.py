"""The adaptive row against its fixed-K twin, paired, with intervals (`--paired`).

Within the adaptive engine every cell runs twice per repetition, adaptive and twin
(bench.live.plan), so the ratio adaptive / twin of one repetition shares the engine, the
prompts and the box's moment. Those per-repetition ratios still spread 10-50 % (at T = 1 the
two runs draw different tokens, and a step's time swings with the box), so a 3 % question
needs many repetitions and an interval, not a median of five:

- per cell: the geometric mean of its repetitions' ratios and a 95 % percentile bootstrap
  interval of it (repetitions resampled with replacement);
- over all cells: the geometric mean of every cell's geometric mean (cells weigh equally),
  with the same bootstrap run stratified by cell (each resample draws each cell's
  repetitions from that cell).

Pure: no processes, no clock; numpy's seeded generator, so a report is reproducible.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

__all__ = ["RESAMPLES", "paired_cells", "paired_summary", "paired_table"]

RESAMPLES = 10_000
LEVEL = 0.95


CELL = ("workload", "temperature", "top_p", "concurrency")


def _cell(m: dict) -> tuple:
    return tuple(m[f] for f in CELL)


def paired_cells(measurements: list[dict]) -> list[dict]:
    """One entry per cell of the engine that ran a twin, in first-seen order: ``workload``,
    ``temperature``, ``top_p``, ``concurrency``, ``config`` (the engine's row), ``twin``,
    ``ratios`` (config over twin, one per repetition that has both) and ``chosen`` (the
    config's depth choices summed over its turns, by depth)."""
    twin_of = {m["config"]: m["twin_of"] for m in measurements if m.get("twin_of")}
    engines = set(twin_of.values())
    by: dict[tuple, dict[int, dict[str, float]]] = defaultdict(dict)
    chosen: dict[tuple, list[float]] = defaultdict(list)
    for m in measurements:
        if m["config"] in engines or m["config"] in twin_of:
            by[(_cell(m), m["rep"])][m["config"]] = m["tokens_per_s"]
        if m["config"] in engines:
            got = chosen[_cell(m)]
            for k, n in enumerate(m["counters"].get("chosen", [])):
                got.extend([0.0] * (k + 1 - len(got)))
                got[k] += n
    out: dict[tuple, dict] = {}
    for (cell, _rep), tps in sorted(by.items(), key=lambda kv: kv[0][1]):
        for twin, engine in twin_of.items():
            if engine in tps and twin in tps:
                c = out.setdefault(cell, {**dict(zip(CELL, cell, strict=True)),
                                          "config": engine, "twin": twin, "ratios": [],
                                          "chosen": chosen.get(cell, [])})
                c["ratios"].append(tps[engine] / tps[twin])
    return list(out.values())


def _gmean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.exp(np.log(x).mean(axis=axis))


def paired_summary(cells: list[dict], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """live.json's ``paired``: ``cells`` (paired_cells' entries with ``reps``, ``geomean``,
    ``median``, ``low`` and ``high``: the 95 % bootstrap interval of the geometric mean) and
    ``all``, the same over the cells (stratified bootstrap), or None without cells."""
    rng = np.random.default_rng(seed)
    tail = (1 - LEVEL) / 2 * 100
    out, boot_cells = [], []
    for c in cells:
        r = np.asarray(c["ratios"], dtype=float)
        idx = rng.integers(0, len(r), size=(resamples, len(r)))
        boot = _gmean(r[idx])
        lo, hi = np.percentile(boot, [tail, 100 - tail])
        out.append({**c, "reps": len(r), "geomean": float(_gmean(r)),
                    "median": float(np.median(r)), "low": float(lo), "high": float(hi)})
        boot_cells.append(boot)
    overall = None
    if out:
        boot = _gmean(np.stack(boot_cells), axis=0)  # each resample: the cells' geomeans
        lo, hi = np.percentile(boot, [tail, 100 - tail])
        overall = {"geomean": float(_gmean(np.array([c["geomean"] for c in out]))),
                   "low": float(lo), "high": float(hi), "cells": len(out), "level": LEVEL,
                   "resamples": resamples}
    return {"cells": out, "all": overall}


def _depths(chosen: list[float]) -> str:
    total = sum(chosen)
    if not total:
        return "-"
    return " ".join(f"{k}:{n / total:.0%}" for k, n in enumerate(chosen))


def paired_table(summary: dict) -> str:
    """The paired comparison as text: one line per cell, then the line over all cells."""
    cells = summary["cells"]
    if not cells:
        return ""
    lines = [f"{cells[0]['config']} over {cells[0]['twin']} (its requests pinned to fixed:K) "
             f"in the same engine, per repetition: geometric mean [{LEVEL:.0%} bootstrap], "
             f"median [min-max], n, the depths {cells[0]['config']} chose"]
    for c in cells:
        sampling = f"T={c['temperature']:g}" + (f" p={c['top_p']:g}" if c["top_p"] < 1 else "")
        lines.append(f"  {c['workload']:<8} {sampling:<10} c={c['concurrency']}: "
                     f"{c['geomean']:.3f} [{c['low']:.3f}-{c['high']:.3f}]  {c['median']:.3f} "
                     f"[{min(c['ratios']):.3f}-{max(c['ratios']):.3f}]  n={c['reps']}  "
                     f"k {_depths(c['chosen'])}")
    a = summary["all"]
    lines.append(f"  all {a['cells']} cells: {a['geomean']:.3f} [{a['low']:.3f}-{a['high']:.3f}]"
                 f" ({a['geomean'] - 1:+.1%})")
    return "\n".join(lines)
