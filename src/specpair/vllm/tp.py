"""The target's tensor-parallel group as the drafting protocol uses it: which rank this is,
rank 0's result handed to every rank, and whether every rank holds the same digests.

vLLM runs the proposer (V1) or speculator (V2) on every TP rank with the same inputs and
keeps the ranks identical only by feeding them identical inputs and random draws
(docs/architecture.md, "Tensor parallelism"). specpair's drafting is not a pure function of
those inputs (an unseeded request's drafter key, the depth policy's timing, a late round),
so only rank 0 drafts and this module hands its result to the others, through vLLM's own TP
group: ``GroupCoordinator.broadcast_object`` (its shared-memory message queue, the channel
vLLM sends each step's scheduler output through; pickled, tensors out of band) and one
``all_reduce`` on the group's CPU (gloo) group for the guard. No other transport.

Outside a vLLM worker (no TP group initialized: unit tests, the in-process probe before
vLLM sets one up) the group is this process alone and every call is free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import torch

__all__ = ["TPGroup", "SINGLE", "tp_group"]

T = TypeVar("T")

_MASK = (1 << 62) - 1  # digests fit 62 bits: their negation fits an int64 too


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the target's TP group."""

    rank: int  # rank within the TP group (0 drafts)
    size: int  # ranks in the group (1: nothing is shared)
    coordinator: Any = None  # vLLM's GroupCoordinator of the TP group (None when size == 1)

    def share(self, obj: T | None) -> T:
        """Rank 0's ``obj`` on every rank (every rank calls this, the others with None)."""
        if self.size == 1:
            return obj  # type: ignore[return-value]
        return self.coordinator.broadcast_object(obj, src=0)

    def agree(self, digests: list[int]) -> list[bool]:
        """Per digest: whether every rank passed the same value (every rank calls this with
        as many digests). One all-reduce (MAX) of each digest and its negation: equal
        everywhere exactly when the max equals the min."""
        if self.size == 1:
            return [True] * len(digests)
        d = torch.tensor([x & _MASK for x in digests], dtype=torch.int64)
        both = torch.cat([d, -d])
        torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX,
                                     group=self.coordinator.cpu_group)
        n = len(digests)
        return [bool(both[i] == -both[n + i]) for i in range(n)]


SINGLE = TPGroup(0, 1)  # a process that is its own group


def tp_group() -> TPGroup:
    """The TP group of this vLLM worker, or SINGLE outside one."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:  # no vLLM: a drafter-only environment
        return SINGLE
    coordinator = parallel_state._TP  # None until vLLM initializes model parallelism
    if coordinator is None or coordinator.world_size == 1:
        return SINGLE
    return TPGroup(coordinator.rank_in_group, coordinator.world_size, coordinator)
