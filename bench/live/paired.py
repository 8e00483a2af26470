"""A row against another, paired per repetition, with intervals (`--paired`, `--versus`,
`--floor`).

What a pair compares is decode tokens/s, or accepted drafts per drafting round (specpair's
sampled drafts over its greedy ones, at T > 0: bench.live.plan.ACCEPTANCE).

Three kinds of pair: the adaptive row against its twin (fixed-K, or off in the floor plan:
within the adaptive engine every cell runs twice per repetition, adaptive and twin:
bench.live.plan), a row against
another engine's row (``Plan.versus``: the engines take turns in each cell, seconds apart on
the same prompts), and a row against the best other row of its cell, two ways: BEST, per
repetition the fastest of every other result row (what a user would pick instead, had they
known each repetition's outcome), and BEST_ROW, the one other row fastest over the cell's
repetitions (the geometric mean of its tokens/s: the configuration a user would pick), read
per repetition. Against BEST a row exactly as fast as two others reads below 1 by noise
alone (the expected best of two equal noisy rows is about exp(s / sqrt(pi)) of one, s a
row's own sd of log tokens/s between repetitions); BEST_ROW carries only the choice among
the rows' means. A cell whose median ratio is below LOSES_BELOW is marked as lost, against
either. Either way the ratio of one repetition shares the cell, the prompts and the box's
moment. Those per-repetition ratios still spread 10-50 % (at T = 1 the two runs draw
different tokens, and a step's time swings with the box), so a question of a few per cent
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

from bench.live.plan import OFF_TWIN

__all__ = ["BEST", "BEST_ROW", "LOSES_BELOW", "MEASURES", "RESAMPLES", "paired_cells",
           "paired_summary", "paired_summaries", "paired_table", "twin_pairs"]

RESAMPLES = 10_000
LEVEL = 0.95
BEST = "best_other"  # a pair's baseline: per repetition, the fastest other row of the cell
BEST_ROW = "best_row"  # a pair's baseline: the other row fastest over the cell's repetitions
LOSES_BELOW = 0.95  # a row over the best other whose median ratio is below this loses the cell
TARGET_ONLY = "target_only"  # the row BEST's entries are also read against (``over_target``)


CELL = ("workload", "temperature", "top_p", "concurrency")
# what a pair compares, as its table header names it
MEASURES = {"tokens_per_s": "decode tokens/s", "accepted_per_round": "accepted drafts per round"}


def _cell(m: dict) -> tuple:
    return tuple(m[f] for f in CELL)


def twin_pairs(measurements: list[dict]) -> list[tuple[str, str]]:
    """(engine row, its twin) for every engine that ran a twin, in first-seen order."""
    return list(dict.fromkeys((m["twin_of"], m["config"]) for m in measurements
                              if m.get("twin_of")))


def _value(m: dict, measure: str) -> float | None:
    """A measurement's ``measure``: its decode tokens/s, or its accepted drafts per drafting
    round (None where it drafted nothing)."""
    if measure == "tokens_per_s":
        return m["tokens_per_s"]
    drafts = m["counters"].get("drafts", 0.0)
    return m["counters"].get("accepted", 0.0) / drafts if drafts else None


def paired_cells(measurements: list[dict], pairs: list[tuple[str, str]],
                 measure: str = "tokens_per_s", exclude: frozenset[str] = frozenset()
                 ) -> list[dict]:
    """One entry per pair (row, baseline) and cell both ran, pair by pair, cells in first-seen
    order: ``workload``, ``temperature``, ``top_p``, ``concurrency``, ``config`` (the row),
    ``baseline`` (a row; BEST: per repetition the best other row but ``exclude``'s, the
    calibrations; BEST_ROW: the other row, but ``exclude``'s, with the highest geometric mean
    over the repetitions it shares with the row), ``twin`` (whether the baseline is the row's
    twin in its own engine),
    ``measure`` ("tokens_per_s", or "accepted_per_round": accepted drafts per drafting
    round), ``ratios`` (row over baseline, one per repetition that has both), ``best`` (with
    BEST or BEST_ROW: which row it was, per repetition), ``over_target`` (with either: the row over
    TARGET_ONLY in the same repetitions, where it ran), ``chosen`` (the row's depth choices summed
    over its turns, by depth) and ``drafted`` (its draft tokens summed over its turns, by
    drafting mode)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {sorted(MEASURES)}, got {measure!r}")
    twins = set(twin_pairs(measurements))
    by: dict[tuple, dict[int, dict[str, float]]] = defaultdict(dict)
    chosen: dict[tuple, list[float]] = defaultdict(list)
    drafted: dict[tuple, dict[str, float]] = defaultdict(dict)
    rows = {row for row, _ in pairs}
    for m in measurements:
        v = _value(m, measure)
        if v is not None:
            by[_cell(m)].setdefault(m["rep"], {})[m["config"]] = v
        if m["config"] in rows:
            got = chosen[(m["config"], _cell(m))]
            for k, n in enumerate(m["counters"].get("chosen", [])):
                got.extend([0.0] * (k + 1 - len(got)))
                got[k] += n
            modes = drafted[(m["config"], _cell(m))]
            for key, n in m["counters"].items():
                if key.startswith("drafted_"):
                    modes[key[8:]] = modes.get(key[8:], 0.0) + n
    out: list[dict] = []
    for row, base in pairs:
        for cell, reps in by.items():
            ratios, best, over_target = [], [], []
            named = _best_row(reps, row, exclude) if base == BEST_ROW else base
            for _, v in sorted(reps.items()):
                others = ({n: x for n, x in v.items() if n != row and n not in exclude}
                          if base == BEST else {named: v[named]} if named in v else {})
                if row not in v or not others:
                    continue
                name = max(others, key=others.__getitem__)
                if others[name] > 0:
                    ratios.append(v[row] / others[name])
                    best.append(name)
                    if base in (BEST, BEST_ROW) and v.get(TARGET_ONLY, 0) > 0:
                        over_target.append(v[row] / v[TARGET_ONLY])
            if ratios:
                out.append({**dict(zip(CELL, cell, strict=True)), "config": row,
                            "baseline": base, "twin": (row, base) in twins,
                            "measure": measure, "ratios": ratios,
                            "best": best if base in (BEST, BEST_ROW) else [],
                            "over_target": over_target,
                            "chosen": chosen.get((row, cell), []),
                            "drafted": drafted.get((row, cell), {})})
    return out


def _best_row(reps: dict[int, dict[str, float]], row: str, exclude: frozenset[str]
              ) -> str | None:
    """The other row (not ``exclude``'s) with the highest geometric mean over the repetitions
    it shares with ``row``; None where none ran beside it."""
    shared: dict[str, list[float]] = defaultdict(list)
    for v in reps.values():
        if row in v:
            for n, x in v.items():
                if n != row and n not in exclude and x > 0:
                    shared[n].append(x)
    return max(shared, key=lambda n: float(_gmean(np.asarray(shared[n]))), default=None)


def _gmean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.exp(np.log(x).mean(axis=axis))


def paired_summary(cells: list[dict], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """One pair's comparison: ``cells`` (paired_cells' entries of that pair, with ``reps``,
    ``geomean``, ``median``, ``low`` and ``high``: the 95 % bootstrap interval of the geometric
    mean) and ``all``, the same over the cells (stratified bootstrap), or None without cells."""
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


def _ngram(drafted: dict[str, float]) -> str:
    """The n-gram drafts' share of the row's draft tokens, where it drafted any."""
    total = sum(drafted.values())
    return f"  ngram {drafted['ngram'] / total:.0%}" if drafted.get("ngram") else ""


def paired_summaries(cells: list[dict]) -> list[dict]:
    """live.json's ``paired``: paired_summary of each pair's cells, pairs in order."""
    def key(c: dict) -> tuple:
        return c["config"], c["baseline"], c["measure"]

    return [paired_summary([c for c in cells if key(c) == p])
            for p in dict.fromkeys(key(c) for c in cells)]


def paired_table(summary: dict) -> str:
    """One pair's comparison as text: one line per cell, then the line over all cells."""
    cells = summary["cells"]
    if not cells:
        return ""
    row, base = cells[0]["config"], cells[0]["baseline"]
    where = (f"(its requests pinned to {'off' if base == OFF_TWIN else 'fixed:K'}) in the same "
             "engine" if cells[0]["twin"] else
             "(another engine, the same cell and repetition, seconds apart)")
    if base == BEST:
        base, where = "the best other row", (f"of the cell, per repetition (best: the row most "
                                             f"often fastest; LOSES: median below "
                                             f"{LOSES_BELOW:g})")
    elif base == BEST_ROW:
        base, where = "the cell's best other row", (f"(best: the row fastest over the cell's "
                                                    f"repetitions, geometric mean; LOSES: "
                                                    f"median below {LOSES_BELOW:g})")
    lines = [f"{row} over {base} {where}, {MEASURES[cells[0]['measure']]} per repetition: "
             f"geometric mean [{LEVEL:.0%} bootstrap], median [min-max], n, the depths {row} "
             "chose"]
    for c in cells:
        sampling = f"T={c['temperature']:g}" + (f" p={c['top_p']:g}" if c["top_p"] < 1 else "")
        best = ""
        if c.get("over_target"):
            t = c["over_target"]
            best = f"  x target-only {np.median(t):.2f} [{min(t):.2f}-{max(t):.2f}]"
        if c.get("best"):
            best += f"  best {max(set(c['best']), key=c['best'].count)}"
            best += "  LOSES" if c["median"] < LOSES_BELOW else ""
        lines.append(f"  {c['workload']:<8} {sampling:<10} c={c['concurrency']}: "
                     f"{c['geomean']:.3f} [{c['low']:.3f}-{c['high']:.3f}]  {c['median']:.3f} "
                     f"[{min(c['ratios']):.3f}-{max(c['ratios']):.3f}]  n={c['reps']}  "
                     f"k {_depths(c['chosen'])}{_ngram(c.get('drafted', {}))}{best}")
    a = summary["all"]
    lines.append(f"  all {a['cells']} cells: {a['geomean']:.3f} [{a['low']:.3f}-{a['high']:.3f}]"
                 f" ({a['geomean'] - 1:+.1%})")
    return "\n".join(lines)
