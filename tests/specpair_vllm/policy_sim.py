"""A simulated engine for the depth policy: bench-live's cells, run the way the live bench
runs them (one engine, cells in rotated order, each cell's streams once adaptive and once
pinned to fixed:K), with step and round costs calibrated on a live run.

Not a measurement: a model of one, for tests that need hundreds of requests in a second.
What it keeps from the engine (bench.live, specpair.vllm.v1.propose_remote):

- a step is ``begin(live)``, one ``observe`` per request that has sampled (not the step
  its prompt is prefilled in), ``depths``, ``handed``, ``round_time``; then the engine's
  forward over every request's 1 + k tokens and the prefill of requests that joined;
- the PROPOSE round is sent when any request asked for drafts: its time grows with the
  depth and the batch, and a request's first round carries its prompt (the drafter's
  prefill); the forward grows with the batch and its tokens; a joining request's prefill
  lands in the step after it joins;
- the verifier accepts draft j with the prompt's own chance given drafts 1..j-1 were;
  every cost carries lognormal noise, all from one seeded generator.

``Costs`` and ``Workload`` come from the live paired runs of
bench/results/2026-12-02-paired.md: the trained pair (its 20-layer target) on the 2-core box:
a forward of 12.9 ms + 0.4 ms per request, rounds of 5.1 ms (one request, K = 3) to 6.8 ms
(four), prefill and first-round extras.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from specpair.vllm.depth_policy import DepthPolicy

__all__ = ["CELLS", "TINY", "TRAINED", "Costs", "SimClock", "Workload", "run_cells", "simulate"]


@dataclass(frozen=True)
class Costs:
    """Milliseconds. forward(B, k) = base + per_req*B + per_token*B*k; round(B, k) = rbase +
    r_req*B + r_depth*k*(1 + r_batch*(B - 1)); extras for a joining request."""

    base: float
    per_req: float
    per_token: float
    rbase: float
    r_req: float
    r_depth: float
    r_batch: float
    prefill: float  # the step a request's prompt is prefilled in, per request
    first_round: float  # a request's first round (its prompt to the drafter)
    noise: float = 0.15  # lognormal sigma of every cost
    hiccup: float = 0.05  # chance that a cost doubles (the box's scheduler, a page fault)

    def forward(self, batch: int, k: int) -> float:
        return self.base + self.per_req * batch + self.per_token * batch * k

    def round(self, batch: int, k: int) -> float:
        return self.rbase + self.r_req * batch + self.r_depth * k * (1 + self.r_batch * (batch - 1))


# the trained pair (its 20-layer target of 2026-12-01) on the 2-core box
# (bench/results/2026-12-02-paired.md)
TRAINED = Costs(12.5, 0.4, 0.1, 3.0, 0.3, 0.6, 0.15, 15.0, 15.0)
# the random tiny pair (overhead-dominated: a drafter round dearer than a target step): a
# 3.5 ms step, a 5 ms round
TINY = Costs(3.0, 0.5, 0.05, 4.2, 0.3, 0.3, 0.1, 3.0, 2.0)


@dataclass(frozen=True)
class Workload:
    """Per-prompt chances that draft j is accepted once 1..j-1 were: prompt i of a cell
    takes ``prompts[i % len(prompts)]``."""

    name: str
    prompts: tuple[tuple[float, ...], ...]
    law: tuple[bool, bool]  # specpair.vllm.depth_policy.sampling_law


CELLS = (
    # greedy code, per prompt as live (fixed:3 twin, 20 repetitions): a hard prompt whose
    # drafts are accepted all or nothing, an easy one, two between
    Workload("code T=0", ((0.26, 1.0, 0.77), (1.0, 1.0, 1.0), (0.91, 0.8, 0.27),
                          (0.48, 0.33, 0.31)), (True, False)),
    # greedy prose: the first draft always, the second almost never
    Workload("prose T=0", ((1.0, 0.05, 1.0),), (True, False)),
    Workload("code T=1", ((0.68, 0.65, 0.7),), (False, False)),
    Workload("prose T=1", ((0.66, 0.67, 0.66),), (False, False)),
    Workload("code top-p", ((0.64, 0.62, 0.6),), (False, True)),
    Workload("prose top-p", ((0.64, 0.61, 0.64),), (False, True)),
)


def _accepted(rng: random.Random, chances: tuple[float, ...], k: int) -> int:
    n = 0
    while n < k and rng.random() < chances[n]:
        n += 1
    return n


def simulate(policy: DepthPolicy, costs: Costs, prompts: list[tuple[float, ...]],
             tokens: int, rng: random.Random, pin: str | None = None,
             law: tuple[bool, bool] = (False, False), tag: str = "r") -> float:
    """One cell's streams (one per prompt, started together) through ``policy`` on a
    clock it shares (``policy.clock`` must be a ``SimClock``); returns decode tokens per
    second (tokens after the first over the streams' mean decode time)."""
    clock = policy.clock
    assert isinstance(clock, SimClock)
    reqs = [f"{tag}{i}" for i in range(len(prompts))]
    done = {r: 0 for r in reqs}  # tokens so far (the prefill's token comes first)
    state = {r: (0, 0) for r in reqs}  # (sampled at this step, drafts handed last step)
    first_token, last_token = {}, {}
    clock.now += _noisy(rng, costs, costs.prefill * len(reqs) + costs.forward(len(reqs), 0)) / 1e3
    for r in reqs:
        done[r], state[r] = 1, (1, 0)
        first_token[r] = clock.now
    seen: set[str] = set()
    while any(n < tokens for n in done.values()):
        live = [r for r in reqs if done[r] < tokens]
        policy.begin(set(live))
        for r in live:
            policy.observe(r, state[r][0], pin, law)
        ks = {r: min(k, tokens - done[r] - 1) for r, k in policy.depths().items()}
        for r, k in ks.items():
            policy.handed(r, k)
        depth = max(ks.values())
        rnd = None
        if depth:
            rnd = _noisy(rng, costs, costs.round(len(live), depth)
                         + costs.first_round * sum(1 for r in live if r not in seen and ks[r]))
            seen |= {r for r in live if ks[r]}
        policy.round_time(None if rnd is None else rnd / 1e3)
        clock.now += ((rnd or 0.0) + _noisy(rng, costs, costs.forward(len(live), depth))) / 1e3
        for r in live:
            acc = _accepted(rng, prompts[reqs.index(r)], ks[r])
            done[r] = min(tokens, done[r] + 1 + acc)
            state[r] = (1 + acc, ks[r])
            if done[r] >= tokens:
                last_token[r] = clock.now
    mean_s = sum(last_token[r] - first_token[r] for r in reqs) / len(reqs)
    return len(reqs) * (tokens - 1) / mean_s


def _noisy(rng: random.Random, costs: Costs, ms: float) -> float:
    return ms * math.exp(rng.gauss(0.0, costs.noise)) * (2.0 if rng.random() < costs.hiccup
                                                         else 1.0)


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0  # seconds

    def __call__(self) -> float:
        return self.now


def run_cells(costs: Costs, reps: int, concurrency: tuple[int, ...] = (1, 4), k: int = 3,
              tokens: int = 128, seed: int = 0, policy: DepthPolicy | None = None) -> dict:
    """bench-live's paired plan on the simulated engine: per cell (workload, c), the
    repetitions' adaptive / fixed:K tokens-per-second ratios, and each turn's rates."""
    clock = SimClock()
    policy = policy or DepthPolicy(k, clock=clock)
    policy.clock = clock
    rng = random.Random(seed)
    cells = [(w, c) for w in CELLS for c in concurrency]
    out: dict = {(w.name, c): {"ratios": [], "adaptive": [], "fixed": []} for w, c in cells}
    n = 0
    for rep in range(reps):
        order = cells[rep % len(cells):] + cells[:rep % len(cells)]
        for w, c in order:
            prompts = [w.prompts[(rep * c + i) % len(w.prompts)] for i in range(c)]
            rates = {}
            for turn in (("adaptive", "fixed") if rep % 2 == 0 else ("fixed", "adaptive")):
                n += 1
                clock.now += 1.0  # between streams: an idle engine
                rates[turn] = simulate(policy, costs, prompts, tokens, rng,
                                       None if turn == "adaptive" else f"fixed:{k}", w.law,
                                       tag=f"{turn[0]}{n}-")
            cell = out[(w.name, c)]
            cell["adaptive"].append(rates["adaptive"])
            cell["fixed"].append(rates["fixed"])
            cell["ratios"].append(rates["adaptive"] / rates["fixed"])
    return out

