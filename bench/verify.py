"""Verifier cost per request-round by q encoding, against one log-softmax pass.

V = 129280, K = 5, B in {1, 4}, temperature in {1.0, 0.6}. Every variant is
timed round-robin in the same loop (so machine load hits them alike) and the
median is reported. Targets (shipping q must not make verification much
dearer than greedy drafts do): SPARSE top-64 within 1.10x of POINT_MASS;
POINT_MASS within 3x of the floor (one fp32 log-softmax over the same
[B, K+1, V] target logits).
"""

from __future__ import annotations

import statistics
import time

import torch

from specpair.draft import DraftMode, propose
from specpair.sampling import SamplingParams
from specpair.verify import verify

V, K = 129_280, 5
ROUNDS = 25


def _variants(b: int, temperature: float):
    g = torch.Generator().manual_seed(b)
    target = torch.randn(b, K + 1, V, generator=g) * 3
    draft = target[:, :K] + torch.randn(b, K, V, generator=g)
    params = SamplingParams.make(b, temperature, seed=list(range(b)))
    pos = torch.full((b,), 100)

    def prop(**kw):
        return propose(draft[:, 0], lambda d, j: draft[:, j], params, pos, K, **kw)

    props = {"POINT_MASS": prop(mode=DraftMode.GREEDY), "SPARSE top-64": prop(draft_top_k=64),
             "DENSE": prop()}
    fns = {"floor (log-softmax)": lambda: torch.log_softmax(target, dim=-1)}
    for name, pr in props.items():
        fns[name] = lambda pr=pr: verify(target, pr, params, pos)
    return fns


def _time(fns: dict, rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():  # warm-up
        f()
    for _ in range(rounds):
        for name, f in fns.items():
            t = time.perf_counter()
            f()
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    print(f"\n## Verifier cost per request-round (V={V}, K={K}, median of {ROUNDS}, "
          f"{torch.get_num_threads()} threads)\n")
    print(f"| B | T | {'variant':20s} | ms/round | ms/request-round | vs floor | vs POINT_MASS |")
    print("|---|---|" + "-" * 22 + "|---|---|---|---|")
    for b in (1, 4):
        for temperature in (1.0, 0.6):
            med = _time(_variants(b, temperature), ROUNDS)
            floor, point = med["floor (log-softmax)"], med["POINT_MASS"]
            for name, t in med.items():
                print(f"| {b} | {temperature} | {name:20s} | {t * 1e3:8.2f} | "
                      f"{t * 1e3 / b:8.2f} | {t / floor:5.2f}x | {t / point:5.2f}x |")
    print("\nTargets: SPARSE top-64 <= 1.10x POINT_MASS; POINT_MASS <= 3x floor.")


if __name__ == "__main__":
    main()
