"""Costs the speed model measures in this process rather than in a server: specpair's V1 q
build per request-round (``specpair.vllm.v1.QRows.write`` of one request's K rows, last
round's cleared, as V1 does each step), for greedy drafts (point masses) and sampled drafts
(a dense law over the vocabulary, what the drafter ships without --draft-top-k)."""

from __future__ import annotations

import statistics
import time

import torch

from specpair import qlaw
from specpair.proposal import QKind
from specpair.vllm.v1 import QRows

__all__ = ["q_build_s"]


def q_build_s(vocab_size: int, depth: int, repeats: int = 200) -> dict[str, float]:
    """Median seconds of one request-round's q build, by drafter mode, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine's share on a 2-core box; one call is small
    try:
        gen = torch.Generator().manual_seed(0)
        logp = torch.log_softmax(torch.randn(depth, vocab_size, generator=gen), dim=-1)
        tokens = torch.randint(0, vocab_size, (depth,), generator=gen)
        laws = {"greedy": qlaw.Drafts(tokens, QKind.POINT_MASS, None, None),
                "sampled": qlaw.Drafts(tokens, QKind.DENSE, logp, None)}
        rows = {m: QRows(depth, vocab_size, 1) for m in laws}
        times: dict[str, list[float]] = {m: [] for m in laws}
        for _ in range(repeats):  # the two modes alternate in one loop
            for mode, d in laws.items():
                t = time.perf_counter()
                rows[mode].write([d])
                times[mode].append(time.perf_counter() - t)
        return {m: statistics.median(v) for m, v in times.items()}
    finally:
        torch.set_num_threads(threads)
