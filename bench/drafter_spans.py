"""Where a drafter round's time goes, on the trained draft model (CPU, one torch thread).

``python -m bench.drafter_spans [ROUNDS]``: the same steady-state rounds as bench/drafter.py
(temperature 1, DENSE q), at B in {1, 4, 16} and K in {3, 5}, timed with ``time.perf_counter``
spans around the parts of a round: ``begin`` (building the round's ids, positions and mask,
stacking the caches, and the first forward), the draft steps' forwards, the model's own
forward calls inside both, sampling (q from the logits, the inverse-CDF draw), the DRAFT
noise (Philox), ``finish`` (splitting the batched cache per request), the q encoding of the
answer (``_item``), folding the items into the engine's state (``_apply``), and the wire
encode of the PROPOSAL. Spans wrap the functions by name for the run (nothing is changed
after it); each share is its summed time over the summed round time, "other" is what no
span covers (the engine's bookkeeping, the cache crop, the wrappers themselves).
docs/performance.md, "Drafter round cost", reads its shares.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from pathlib import Path

import torch

import specpair.draft as draft
import specpair.drafter.engine as engine
import specpair.drafter.model as model
from bench.drafter import _Target
from specpair.wire.codec import encode

DRAFT = Path(__file__).resolve().parents[1] / "models" / "trained" / "draft"
SPANS = {  # span -> (module or class, attribute)
    "begin": (model.HFDraftModel, "begin"),
    "steps": (model._HFSession, "step"),
    "sampling": (draft, "_step"),
    "noise": (draft, "uniform"),
    "finish": (model._HFSession, "finish"),
    "apply": (engine.DrafterEngine, "_apply"),
    "q encode": (engine.DrafterEngine, "_item"),
}
COLUMNS = ["begin", "steps", "forward", "sampling", "noise", "finish", "apply", "q encode",
           "wire encode"]


def _wrap(owner: object, name: str, key: str, acc: dict) -> None:
    f = getattr(owner, name)

    def timed(*a, **k):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[key] += time.perf_counter() - t

    setattr(owner, name, timed)


def main(rounds: int = 60) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    saved = {key: (o, n, getattr(o, n)) for key, (o, n) in SPANS.items()}
    acc: dict[str, float] = collections.defaultdict(float)
    try:
        for key, (o, n) in SPANS.items():
            _wrap(o, n, key, acc)
        m = model.HFDraftModel(DRAFT)
        _wrap(m, "forward", "forward", acc)  # the drafter's forward (LlamaForward or HFForward)
        _table(m, rounds, acc)
    finally:
        for o, n, f in saved.values():
            setattr(o, n, f)
        torch.set_num_threads(threads)


def _table(m: model.HFDraftModel, rounds: int, acc: dict[str, float]) -> None:
    print(f"\n## Drafter round cost, trained draft (T=1, dense q, median of {rounds} rounds, "
          "1 thread; shares of the summed round time)\n")
    print("| B | K | round ms p50 | p99 | " + " | ".join(COLUMNS) + " | other |")
    print("|---|---|---|---|" + "---|" * (len(COLUMNS) + 1))
    for b in (1, 4, 16):
        for k in (3, 5):
            tg = _Target(engine.DrafterEngine(m, tokenizer_fingerprint=bytes(32),
                                              wire_version=1), b, seed=b, k=k)
            times, parts = [], collections.defaultdict(float)
            for i in range(rounds + 2):  # the first two rounds (prefill) are warm-up
                acc.clear()
                t = time.perf_counter()
                got = tg.engine.handle(tg.request(list(range(b))))
                t1 = time.perf_counter()
                encode(got)
                t2 = time.perf_counter()
                acc["wire encode"] += t2 - t1
                tg.answer(got)
                if i >= 2:
                    times.append(t2 - t)
                    for key, v in acc.items():
                        parts[key] += v
            total = sum(times)
            covered = sum(v for key, v in parts.items() if key != "forward")
            cells = [f"{100 * parts[c] / total:.0f} %" for c in COLUMNS]
            p99 = statistics.quantiles(times, n=100, method="inclusive")[98]
            print(f"| {b} | {k} | {statistics.median(times) * 1e3:.2f} | {p99 * 1e3:.2f} | "
                  + " | ".join(cells)
                  + f" | {100 * (total - covered) / total:.0f} % |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
