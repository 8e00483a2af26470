"""A simulated engine for the depth policy: bench-live's cells, run the way the live bench
runs them (one engine, cells in rotated order, each cell's streams once adaptive and once
pinned to fixed:K), with step and round costs calibrated on a live run.

Not a measurement: a model of one, for tests that need hundreds of requests in a second.
What it keeps from the engine (bench.live, specpair.vllm.v1.propose_remote):

- a step is ``begin(live)``, one ``observe`` per request that has sampled (not the step
  its prompt is prefilled in), ``depths``, ``handed``, ``round_time``; then the engine's
  forward over every request's 1 + k tokens and the prefill of requests that joined;
- the PROPOSE round is sent when any request asked for drafts: its time grows with the
  depth and the batch, a request's first round carries its prompt (the drafter's
  prefill), and a round after steps in which the request drafted nothing carries the
  tokens committed meanwhile (``Costs.catch_up``); the forward grows with the batch and its
  tokens; a joining request's prefill lands in the step after it joins;
- the verifier accepts draft j with the prompt's own chance given drafts 1..j-1 were;
  every cost carries lognormal noise, all from one seeded generator; a ``Load`` scales the
  costs by the clock (a slow start, a loaded minute).

``Costs`` and ``Workload`` come from the live paired runs of
bench/results/2026-12-02-paired.md: the trained pair (its 20-layer target) on the 2-core box:
a forward of 12.9 ms + 0.4 ms per request, rounds of 5.1 ms (one request, K = 3) to 6.8 ms
(four), prefill and first-round extras. ``LIVE`` and the ``UNSEEN`` workloads replay the
committed pair at c = 1 on code the benchmark never saw (``stream``: requests one after the
other, each step traced with its expected tokens and time, ``recovery``: how long the policy
takes to come within 5 % of the best fixed setting).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from specpair.vllm.depth_policy import DepthPolicy
from specpair.vllm.policy_estimates import expected_tokens

__all__ = ["C16", "C16_LAWS", "CELLS", "FOREIGN", "INTEL_C1", "LIVE", "SCENARIOS", "SLOW_S",
           "TINY", "TRAINED", "UNSEEN", "Costs", "Load", "SimClock", "Step", "Workload",
           "by_request", "fixed_rates", "rate", "recovery", "run_cells", "scenario", "simulate",
           "slow", "slowdown", "stream", "unseen_run"]


@dataclass(frozen=True)
class Costs:
    """Milliseconds. forward(B, k) = base + per_req*B + per_token*B*k (+ jump*B at k > 0);
    round(B, k) = rbase + r_req*B + r_depth*k*(1 + r_batch*(B - 1)); extras for a joining
    request; ``truncated``'s factors where the sampling law truncates (``law``: top-p,
    top-k)."""

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
    # per token a round carries beyond the step's own: what a request committed while it
    # drafted nothing, caught up by its next round (0: not modelled)
    catch_up: float = 0.0
    # per request, what the verify costs more as soon as there are drafts at all (live at
    # c = 16, the rest of the step jumps at d > 0 and then grows slowly; 0: a line)
    jump: float = 0.0
    # where the law truncates, factors on: the forward without drafts, what drafts add to
    # it, the round (live at c = 16 under top-p: 1.15, 2.1 and 2.2 against T = 1)
    truncated: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def forward(self, batch: int, k: int, law: tuple[bool, bool] = (False, False)) -> float:
        zero, drafted, _ = self.truncated if law[1] else (1.0, 1.0, 1.0)
        return (zero * (self.base + self.per_req * batch)
                + (drafted * batch * (self.per_token * k + self.jump) if k else 0.0))

    def round(self, batch: int, k: int, law: tuple[bool, bool] = (False, False)) -> float:
        factor = self.truncated[2] if law[1] else 1.0
        return factor * (self.rbase + self.r_req * batch
                         + self.r_depth * k * (1 + self.r_batch * (batch - 1)))


# the trained pair (its 20-layer target of 2026-12-01) on the 2-core box
# (bench/results/2026-12-02-paired.md)
TRAINED = Costs(12.5, 0.4, 0.1, 3.0, 0.3, 0.6, 0.15, 15.0, 15.0)
# the random tiny pair (overhead-dominated: a drafter round dearer than a target step): a
# 3.5 ms step, a 5 ms round
TINY = Costs(3.0, 0.5, 0.05, 4.2, 0.3, 0.3, 0.1, 3.0, 2.0)
# the committed trained pair (its 24-layer target) on the quiet 2-core box at c = 1
# (docs/performance.md: a target step of about 39 ms, a remote round of 6.0-6.5 ms and 0.6
# ms on the target's side at K = 3); the catch-up per token is assumed, not measured (about
# a drafter prefill's cost of a token)
LIVE = Costs(38.0, 0.5, 0.3, 4.2, 0.3, 0.7, 0.15, 60.0, 15.0, catch_up=0.05)
# the committed pair at c = 1 on the 2-core Intel box, threads bound (the policy's step log
# beside the fixed:3 twin, 2026-12-07, medians): the rest of a step 15 ms without drafts and
# 18 at 3 (a jump once there are drafts), the round 7 ms at 3
INTEL_C1 = Costs(14.5, 0.5, 0.2, 4.2, 0.3, 0.83, 0.15, 30.0, 10.0, catch_up=0.05, jump=2.4)
# the committed pair at c = 16 (bench/results/2026-12-04-live.md, top-p 0.9): a step without
# drafts of 33 ms (target-only read 33.5), the verify of 3 drafts a request 0.65 ms a draft
# more (the rest of a K = 3 step about 64 ms), a round of about 22 ms at K = 3 (18-28 read);
# the rest as LIVE
C16 = Costs(25.0, 0.5, 0.65, 4.2, 0.3, 1.3, 0.15, 60.0, 15.0, catch_up=0.05)
# the committed pair at c = 16 per law, from the policy's step log (``make bench-trace
# STEPS=1``, bench/results/2026-12-05-trace.md; pinned rows, medians): the rest of the step
# 29.0 ms without drafts and 40.7 at 3 at T = 1 (a jump at d > 0, then 1 ms a depth), 33.3 and
# 58.0 under top-p; the round at 3 14.3 ms at T = 1, 30.9 under top-p
C16_LAWS = Costs(21.0, 0.5, 0.06, 4.2, 0.3, 0.54, 0.15, 60.0, 15.0, catch_up=0.05, jump=0.55,
                 truncated=(1.15, 2.1, 2.2))


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


# code the benchmark never saw (third-party packages), c = 1, 64 tokens: per-prompt chances
# chosen so that fixed:3 on ``LIVE`` reads what the pinned engine read live there, 1.40x
# target-only at T = 1 and 1.30x at T = 0 (greedy: one prompt's first draft hard, the rest
# then likely, as the bench's greedy code)
UNSEEN = {
    1.0: Workload("unseen code T=1", ((0.40, 0.5, 0.5), (0.45, 0.55, 0.5), (0.35, 0.45, 0.55),
                                      (0.42, 0.5, 0.45)), (False, False)),
    0.0: Workload("unseen code T=0", ((0.15, 0.9, 0.8), (0.4, 0.5, 0.5), (0.3, 0.6, 0.6),
                                      (0.35, 0.45, 0.45)), (True, False)),
}
# drafts that are almost never accepted (text the draft never learned): target-only pays
FOREIGN = (0.05, 0.3, 0.3)


def _accepted(rng: random.Random, chances: tuple[float, ...], k: int) -> int:
    n = 0
    while n < k and rng.random() < chances[n]:
        n += 1
    return n


@dataclass(frozen=True)
class Step:
    """One simulated decode step, for a trace: its depth (the largest drafted), its requests,
    the tokens they were expected to commit (their prompts' true chances) and the time it
    was expected to take (its costs without noise, the load included)."""

    depth: int
    requests: int
    tokens: float
    seconds: float
    request: int  # the index of its first request in the run (``stream``)
    at: float  # the clock when it began


Load = Callable[[float], tuple[float, float]]  # clock -> (forward's factor, round's factor)


def slow(until_s: float, round_factor: float, forward_factor: float = 1.0) -> Load:
    """Costs scaled until the clock reads ``until_s`` (a cold drafter, a loaded box), then
    as calibrated."""
    return lambda now: (forward_factor, round_factor) if now < until_s else (1.0, 1.0)


def simulate(policy: DepthPolicy, costs: Costs, prompts: list[tuple[float, ...]],
             tokens: int, rng: random.Random, pin: str | None = None,
             law: tuple[bool, bool] = (False, False), tag: str = "r",
             load: Load | None = None, trace: list[Step] | None = None, index: int = 0,
             reproducible: bool = False) -> float:
    """One cell's streams (one per prompt, started together) through ``policy`` on a
    clock it shares (``policy.clock`` must be a ``SimClock``); returns decode tokens per
    second (tokens after the first over the streams' mean decode time). ``load``: factors
    on the forward's and the round's costs by the clock's time (a loaded box); ``trace``:
    each decode step appended (``index``: the first request's index there)."""
    clock = policy.clock
    assert isinstance(clock, SimClock)
    reqs = [f"{tag}{i}" for i in range(len(prompts))]
    done = {r: 0 for r in reqs}  # tokens so far (the prefill's token comes first)
    state = {r: (0, 0) for r in reqs}  # (sampled at this step, drafts handed last step)
    sent = {r: 0 for r in reqs}  # tokens the drafter holds (0: none, its first round is due)
    first_token, last_token = {}, {}
    f_load, r_load = load(clock.now) if load else (1.0, 1.0)
    clock.now += _noisy(rng, costs, f_load * (costs.prefill * len(reqs)
                                              + costs.forward(len(reqs), 0, law))) / 1e3
    for r in reqs:
        done[r], state[r] = 1, (1, 0)
        first_token[r] = clock.now
    while any(n < tokens for n in done.values()):
        live = [r for r in reqs if done[r] < tokens]
        now = clock.now
        f_load, r_load = load(now) if load else (1.0, 1.0)
        policy.begin(set(live))
        for r in live:
            policy.observe(r, state[r][0], pin, law, reproducible)
        ks = {r: min(k, tokens - done[r] - 1) for r, k in policy.depths().items()}
        for r, k in ks.items():
            policy.handed(r, k)
        depth = max(ks.values())
        rnd = None
        if depth:
            extra = 0.0
            for r in live:
                if ks[r]:  # its prompt (first round), or what it committed without drafts
                    extra += (costs.first_round if not sent[r] else 0.0) + costs.catch_up * (
                        done[r] - max(sent[r], 1) - (state[r][0] if sent[r] else 0))
                    sent[r] = done[r]
            base = r_load * (costs.round(len(live), depth, law) + extra)
            rnd = _noisy(rng, costs, base)
        policy.round_time(None if rnd is None else rnd / 1e3)
        fwd = f_load * costs.forward(len(live), depth, law)
        if trace is not None:
            trace.append(Step(depth, len(live), sum(
                expected_tokens(list(prompts[reqs.index(r)]), ks[r]) for r in live),
                (fwd + (base if depth else 0.0)) / 1e3, index, now))
        clock.now += ((rnd or 0.0) + _noisy(rng, costs, fwd)) / 1e3
        for r in live:
            acc = _accepted(rng, prompts[reqs.index(r)], ks[r])
            done[r] = min(tokens, done[r] + 1 + acc)
            state[r] = (1 + acc, ks[r])
            if done[r] >= tokens:
                last_token[r] = clock.now
    mean_s = sum(last_token[r] - first_token[r] for r in reqs) / len(reqs)
    return len(reqs) * (tokens - 1) / mean_s


def stream(policy: DepthPolicy, costs: Costs, prompt: Callable[[int], tuple[float, ...]],
           requests: int, rng: random.Random, tokens: int = 64, c: int = 1,
           pin: str | None = None, law: tuple[bool, bool] = (False, False),
           load: Load | None = None, idle_s: float = 0.5,
           reproducible: bool = False) -> list[Step]:
    """``requests`` requests through one engine, ``c`` at a time (each wave started together,
    an idle gap between waves), request i drafting with ``prompt(i)``'s chances: the trace
    of every decode step."""
    trace: list[Step] = []
    for first in range(0, requests, c):
        policy.clock.now += idle_s
        simulate(policy, costs, [prompt(i) for i in range(first, first + c)], tokens, rng,
                 pin, law, tag=f"{pin}-{first}-", load=load, trace=trace, index=first,
                 reproducible=reproducible)
    return trace


def rate(steps: list[Step]) -> float:
    """Expected tokens per second of ``steps`` (their expected tokens over expected time)."""
    return sum(s.tokens for s in steps) / sum(s.seconds for s in steps)


def by_request(trace: list[Step]) -> dict[int, tuple[float, float, int]]:
    """Per request (at c = 1; a wave's first at c > 1): its steps' expected tokens, expected
    seconds and request-rounds."""
    out: dict[int, tuple[float, float, int]] = {}
    for s in trace:
        t, sec, n = out.get(s.request, (0.0, 0.0, 0))
        out[s.request] = (t + s.tokens, sec + s.seconds, n + s.requests)
    return out


def recovery(trace: list[Step], start: int, reference: list[Step], window: int = 64,
             within: float = 0.95) -> tuple[int, float] | None:
    """How long the policy takes to come within ``within`` of the best fixed setting after
    a change at step ``start`` (the slow start's end, a new workload): the request-rounds
    from there to the first ``window`` steps that made at least ``within`` of the tokens
    the best fixed setting makes in their time on the same requests (``reference``: its
    trace of them on a quiet engine, each request's rate), and the same ratio from there to
    the end of the run (None: never)."""
    ref = {r: t / sec for r, (t, sec, _) in by_request(reference).items()}
    tokens, worth = [0.0], [0.0]  # prefix sums: tokens made, the reference's in that time
    for s in trace:
        tokens.append(tokens[-1] + s.tokens)
        worth.append(worth[-1] + s.seconds * ref[s.request])
    for i in range(start, len(trace) - window + 1):
        if tokens[i + window] - tokens[i] >= within * (worth[i + window] - worth[i]):
            rest = (tokens[-1] - tokens[i]) / (worth[-1] - worth[i])
            return sum(s.requests for s in trace[start:i]), rest
    return None


def unseen_run(temperature: float, requests: int, seed: int, pin: str | None = None,
               load: Load | None = None, prompt: Callable[[int], tuple[float, ...]] | None = None,
               k: int = 3) -> tuple[list[Step], DepthPolicy]:
    """``requests`` requests of 64 tokens at c = 1 on ``LIVE`` through a fresh engine's
    policy; their chances ``prompt(i)`` (default: the ``UNSEEN`` workload's prompts in
    turn)."""
    w = UNSEEN[temperature]
    policy = DepthPolicy(k, clock=SimClock())
    trace = stream(policy, LIVE, prompt or (lambda i: w.prompts[i % len(w.prompts)]),
                   requests, random.Random(seed), pin=pin, law=w.law, load=load)
    return trace, policy


def fixed_rates(temperature: float, requests: int = 24,
                prompt: Callable[[int], tuple[float, ...]] | None = None,
                k: int = 3) -> list[float]:
    """Each fixed setting's rate, 0..k, on a quiet engine (``unseen_run``)."""
    return [rate(unseen_run(temperature, requests, 0, f"fixed:{d}", prompt=prompt, k=k)[0])
            for d in range(k + 1)]


SLOW_S = 10.0  # a cold engine: its drafter's rounds 8x as slow (55 ms) for its first 10 s
SCENARIOS = ("cold", "loaded", "switch", "switch_down")


def scenario(name: str, temperature: float, seed: int, k: int = 3
             ) -> tuple[list[Step], int, list[Step]]:
    """A run of ``SCENARIOS``' ``name``, the step its change came at, and the best fixed
    setting's trace of the same requests on a quiet engine (best after the change):
    ``cold`` (40 requests, the first 10 s slow), ``loaded`` (100 requests, a first minute
    with rounds 6x and the target's steps 1.2x as slow), ``switch`` (30 requests of
    ``FOREIGN`` chances, then 40 of code), ``switch_down`` (40 of code, then 30 of
    ``FOREIGN``, where not drafting is the best setting)."""
    prompts = UNSEEN[temperature].prompts
    code = lambda i: prompts[i % len(prompts)]  # noqa: E731
    prompt, load, n, at_s, first = {
        "cold": (code, slow(SLOW_S, 8.0), 40, SLOW_S, 0),
        "loaded": (code, slow(60.0, 6.0, 1.2), 100, 60.0, 0),
        "switch": (lambda i: FOREIGN if i < 30 else code(i), None, 70, 0.0, 30),
        "switch_down": (lambda i: code(i) if i < 40 else FOREIGN, None, 70, 0.0, 40),
    }[name]
    trace, _ = unseen_run(temperature, n, seed, load=load, prompt=prompt, k=k)
    start = next(i for i, s in enumerate(trace) if s.at >= at_s and s.request >= first)
    fixed = [unseen_run(temperature, n, seed, f"fixed:{d}", prompt=prompt, k=k)[0]
             for d in range(k + 1)]
    return trace, start, max(fixed, key=lambda t: rate([s for s in t if s.request >= first
                                                          and s.request >= trace[start].request]))


def slowdown(seed: int, factor: float, seconds: float, tokens: int = 1200) -> tuple[int, int]:
    """The box slowing at c = 16 under top-p (``C16_LAWS``, code top-p): three waves of 16
    requests on a quiet engine, then 16 of ``tokens`` whose target forwards take ``factor``
    times as long for ``seconds`` from 3 s in (the r32 episode: the steps without drafts
    took 30-50 ms for about 6 s against 21). Returns the steps that drafted after the box
    recovered and the steps there (on a quiet box: the probes', about 2 %)."""
    w = CELLS[4]
    clock = SimClock()
    policy = DepthPolicy(3, clock=clock)
    rng = random.Random(seed)
    for i in range(3):
        clock.now += 1.0
        simulate(policy, C16_LAWS, [w.prompts[0]] * 16, 128, rng, None, w.law, tag=f"w{i}-")
    clock.now += 1.0
    start = clock.now + 3.0
    end = start + seconds
    trace: list[Step] = []
    simulate(policy, C16_LAWS, [w.prompts[0]] * 16, tokens, rng, None, w.law, tag="s-",
             load=lambda now: (factor, 1.0) if start <= now < end else (1.0, 1.0),
             trace=trace)
    after = [s for s in trace if s.at >= end]
    return sum(1 for s in after if s.depth), len(after)


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



if __name__ == "__main__":  # the figures docs/performance.md quotes: python policy_sim.py [SEEDS]
    import statistics
    import sys

    seeds = range(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
    for t in (1.0, 0.0):
        off, *_, fixed = fixed_rates(t)
        line = []
        for seed in seeds:
            trace, _ = unseen_run(t, 24, seed, load=slow(SLOW_S, 8.0))
            after = [s for s in trace if s.at >= SLOW_S]
            zero = sum(s.requests for s in after if not s.depth) / sum(s.requests for s in after)
            line.append((rate(after) / fixed, zero))
        print(f"T = {t:g}: fixed:3 {fixed / off:.3f}x target-only; after a 10 s slow start, "
              f"adaptive over fixed:3 median {statistics.median(r for r, _ in line):.3f} "
              f"[{min(r for r, _ in line):.3f}-{max(r for r, _ in line):.3f}], depth 0 "
              f"{statistics.median(z for _, z in line):.1%} [{min(z for _, z in line):.1%}-"
              f"{max(z for _, z in line):.1%}]")
        for name in SCENARIOS:
            got = [recovery(*scenario(name, t, seed)) for seed in seeds]
            done = [r for r in got if r is not None]
            rounds = [r for r, _ in done]
            print(f"  {name:12s} request-rounds to within 5 % of the best fixed setting: "
                  + (f"median {statistics.median(rounds):g}, max {max(rounds)}; then "
                     f"{min(x for _, x in done):.3f}-{max(x for _, x in done):.3f} of it to "
                     "the end" if done else "never")
                  + (f" ({len(got) - len(done)} of {len(got)} never)" if len(done) < len(got)
                     else ""))
    for factor, seconds in ((1.7, 3.0), (1.7, 6.0), (2.0, 6.0), (2.0, 12.0)):
        got = [slowdown(seed, factor, seconds) for seed in range(30)]
        stuck = [d for d, _ in got if d > 100]
        print(f"c = 16 top-p, the forward {factor:g}x for {seconds:g} s: drafting on after the "
              f"recovery in {len(stuck)} of 30 seeds"
              + (f" ({min(stuck)}-{max(stuck)} drafted steps of the "
                 f"{min(n for _, n in got)}-{max(n for _, n in got)} after it)" if stuck else "")
              + f"; else {min(d for d, _ in got if d <= 100)}-"
              f"{max(d for d, _ in got if d <= 100)} drafted steps (the probes')")
