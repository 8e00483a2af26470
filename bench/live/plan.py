"""What `make bench-live` measures: the configurations, the cells, the repetitions.

A configuration is one vLLM engine (one start each: about 25 s quiet, minutes on a loaded
box). A cell is (workload, sampling setting, concurrency). Inside one engine the cells are
interleaved across repetitions: repetition r runs every cell once (in an order rotated by r)
before repetition r + 1 starts, so slow drift of the machine spreads over all cells instead
of landing on one. Engines cannot be interleaved (one at a time fits the box), so target-only
is run twice, first and last (``target_only`` phases A and B): a speculative row's ratio in
repetition r is its tokens/s over the mean of target-only's two phase-r values for the same
cell, and the A/B difference is reported as the run's drift. ``draft_alone`` (the draft model
served alone, target-only) is a calibration for the speed model, not a result row.

Engine-to-engine drift (the A/B line: tens of per cent here) is far wider than the 3 % by
which the adaptive policy must stay near its best fixed depth, so the adaptive engine also
runs a TWIN of every cell: the same streams with the request's own depth policy pinned to
fixed:K (``vllm_xargs``, specpair.vllm.depth_policy.PIN_ARG), interleaved with the adaptive
ones (which goes first alternates by repetition). Pinned requests teach the adaptive
estimates nothing, so the adaptive row stays the policy as shipped, and its ratio to the
twin is paired within one engine and one repetition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["K", "PAIRED_REPS", "TWIN", "Config", "Plan", "Sampling", "configs", "full_plan",
           "paired_plan", "quick_plan"]

K = 3  # draft depth of every speculative configuration
PAIRED_REPS = 20  # repetitions of the paired plan: enough for a few per cent (bench.live.paired)


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
REMOTE = {"method": "custom_class", "model": "specpair.vllm.v1.RemoteProposer",
          "num_speculative_tokens": K}


def configs(calibrate: bool) -> list[tuple[Config, str]]:
    """(configuration, phase) in run order; ``calibrate``: with the draft-alone engine."""
    target = Config("target_only")
    run = [
        (target, "A"),
        (Config("vllm_ngram", {"method": "ngram", "num_speculative_tokens": K}), ""),
        # vLLM's default draft_sample_method ("greedy"): argmax drafts, point-mass q
        (Config("vllm_draft_model", {"method": "draft_model", "model": "DRAFT",
                                     "num_speculative_tokens": K}), ""),
        # the fixed-K rows pin the depth policy to K; specpair_adaptive runs it as shipped
        (Config("specpair_greedy", REMOTE, ("--mode", "greedy"), f"fixed:{K}"), ""),
        (Config("specpair_sampled", REMOTE, ("--mode", "sampled"), f"fixed:{K}"), ""),
        (Config("specpair_adaptive", REMOTE, ("--mode", "sampled"), "adaptive",
                twin=(TWIN, f"fixed:{K}")), ""),
    ]
    if calibrate:
        run.append((Config("draft_alone", model="draft", result=False), ""))
    run.append((target, "B"))
    return run



@dataclass(frozen=True)
class Plan:
    name: str  # "full", "QUICK" or "paired"
    reps: int
    max_tokens: int
    samplings: tuple[Sampling, ...]
    concurrencies: tuple[int, ...]
    workloads: tuple[str, ...]
    calibrate: bool
    run: list[tuple[Config, str]] = field(default_factory=list)

    def cells(self, rep: int) -> list[tuple[str, Sampling, int]]:
        """Every cell once, rotated by ``rep``."""
        cells = [(w, s, c) for w in self.workloads for s in self.samplings
                 for c in self.concurrencies]
        r = rep % len(cells)
        return cells[r:] + cells[:r]

    def measurements(self) -> int:
        cells = self.reps * len(self.cells(0))
        return sum(cells * (2 if c.twin else 1) + len(self.concurrencies)  # + warm-ups
                   for c, _ in self.run)

    def estimate_s(self, start_s: float = 35.0, tokens_per_s: float = 60.0) -> float:
        """Seconds the run should take on a quiet 2-core box (engine starts plus streams at
        a conservative rate); a loaded box takes longer."""
        per = 0.3 + self.max_tokens / tokens_per_s
        return len(self.run) * start_s + self.measurements() * per


SAMPLINGS = (Sampling(0.0, 1.0), Sampling(1.0, 1.0), Sampling(1.0, 0.9))


def full_plan(workloads: tuple[str, ...]) -> Plan:
    return Plan("full", 5, 128, SAMPLINGS, (1, 4), workloads, True, configs(True))


def quick_plan(workloads: tuple[str, ...]) -> Plan:
    """Fewer repetitions and tokens, no top-p setting, no draft-alone calibration."""
    return Plan("QUICK", 2, 32, SAMPLINGS[:2], (1, 4), workloads, False, configs(False))


def paired_plan(workloads: tuple[str, ...]) -> Plan:
    """The adaptive engine alone, its twin beside it, many repetitions of the full plan's
    cells: the adaptive-vs-fixed question with intervals (bench.live.paired)."""
    return Plan("paired", PAIRED_REPS, 128, SAMPLINGS, (1, 4), workloads, False,
                [(c, p) for c, p in configs(False) if c.twin is not None])
