"""What tensor parallelism adds to a decode step's drafting: rank 0's answer handed to the
other rank and the guard's digests (``specpair.vllm.drafting``, ``specpair.vllm.tp``).

V = 129280, K = 5, SPARSE top-64 q (what the drafter ships), B = 1, 4, 16 requests, each
committing one token a round. Two real ranks of vLLM's TP group on CPU (bench/tpgroup.py:
gloo, vLLM's shared-memory broadcaster), one thread each. Per round, interleaved: the TP = 2
step on both ranks (rank 0 drafts from a prepared wire answer, as bench/target_round.py does,
and shares it; both digest and all-reduce), then on rank 0 the same step of a one-rank
Drafting (nothing shared, nothing digested): the side-by-side column. The step here is
``Drafting.step``: session bookkeeping, the frame decode and the sharing; the q build into
vLLM's buffers is the same at any TP size and is in bench/target_round.py.
Median and range (min .. max) over the rounds, in ms.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch

from bench.target_round import _PreparedWire
from bench.tpgroup import run_ranks
from bench.wire import _items
from specpair.vllm.depth_policy import DepthPolicy
from specpair.vllm.drafting import Drafting, RequestStep, digest
from specpair.vllm.policy_setting import PolicySetting
from specpair.vllm.tp import SINGLE, TPGroup, tp_group

V, K = 129_280, 5
BATCHES = (1, 4, 16)
ROUNDS = 60
CONTEXT = 1024


class _Timed:
    """A TP group that adds the time spent in its calls to ``spent`` (seconds)."""

    def __init__(self, group: TPGroup) -> None:
        self.group, self.rank, self.size = group, group.rank, group.size
        self.spent = {"share": 0.0, "agree": 0.0}

    def _timed(self, key: str, call):
        t = time.perf_counter()
        try:
            return call()
        finally:
            self.spent[key] += time.perf_counter() - t

    def share(self, obj):
        return self._timed("share", lambda: self.group.share(obj))

    def agree(self, digests):
        return self._timed("agree", lambda: self.group.agree(digests))


def _drafting(group, b: int) -> Drafting:
    d = Drafting(K, V, CONTEXT + 4 * ROUNDS, "unused", group=group)
    d.policy = DepthPolicy(K, PolicySetting("fixed"))  # every round at K, as prepared
    if group.rank == 0:
        d.source = _PreparedWire(_items(b)["SPARSE top-64"])
    return d


def _rank(rank: int, b: int) -> dict[str, list[float]]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    timed = _Timed(tp_group())
    tp, alone = _drafting(timed, b), _drafting(SINGLE, b) if rank == 0 else None
    ids = [f"r{i}" for i in range(b)]
    table = torch.from_numpy(np.random.default_rng(0).integers(
        0, V, (b, CONTEXT + 4 * ROUNDS), dtype=np.int64))
    out: dict[str, list[float]] = {"tp": [], "alone": [], "share": [], "agree": []}
    for r in range(ROUNDS + 3):
        n = CONTEXT + r
        reqs = [RequestStep(rid, n, 1, 1.0, 0, 1.0, 3) for rid in ids]
        # what V1 digests as appended: request ids, the sampled tokens, the lengths
        last, lengths = table[:, n - 1], torch.full((b,), n)
        step = {"reqs": reqs, "live": ids, "tokens": lambda i, s, e: table[i, s:e],
                "appended": lambda last=last, lengths=lengths: digest(*ids, last, lengths)}
        before = dict(timed.spent)
        t = time.perf_counter()
        tp.step(**step)
        dt = time.perf_counter() - t
        if r >= 3:  # the first rounds send whole histories
            out["tp"].append(dt)
            for k in ("share", "agree"):
                out[k].append(timed.spent[k] - before[k])
        if alone is not None:
            t = time.perf_counter()
            alone.step(**step)
            if r >= 3:
                out["alone"].append(time.perf_counter() - t)
    return out


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.3f} ({min(xs) * 1e3:.3f} .. {max(xs) * 1e3:.3f})"


def main() -> None:
    print(f"\n## Tensor parallelism: a step's drafting at TP = 2 beside TP = 1 (V={V}, K={K}, "
          f"SPARSE top-64, context {CONTEXT}, {ROUNDS} rounds, interleaved)\n")
    print("| requests | TP = 1 step ms | TP = 2 step ms, rank 0 | of it: share ms "
          "| of it: guard all-reduce ms | TP = 2 / TP = 1 | rank 1 step ms |")
    print("|---|---|---|---|---|---|---|")
    for b in BATCHES:
        r0, r1 = run_ranks(_rank, b)
        ratio = statistics.median(r0["tp"]) / statistics.median(r0["alone"])
        print(f"| {b} | {_fmt(r0['alone'])} | {_fmt(r0['tp'])} | {_fmt(r0['share'])} "
              f"| {_fmt(r0['agree'])} | {ratio:.2f}x | {_fmt(r1['tp'])} |")


if __name__ == "__main__":
    main()
