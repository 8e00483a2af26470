"""The probability wire per request-round: bytes, encode+decode time, loopback round trip.

V = 129280, K = 5. SPARSE top-64 (the law truncated to 64 ids, what the drafter
ships with draft_top_k = 64) against DENSE fp32 over the whole vocabulary.
Codec times, per request-round (divided by B): the median of single
encode+decode calls on the wall clock (each call timed alone, so a preemption
on this shared machine spoils one sample, not the median), and the thread CPU
time per call (what the call costs when other processes take the cores away
mid-call). SPARSE and DENSE are sampled round-robin in the same loop. The loopback round
trip is DraftClient.propose against a WireServer on 127.0.0.1 whose handler
returns a prepared answer (so it measures the wire, not a model): p50 and p99
over the rounds. Targets (the wire must cost little beside a drafter round of
milliseconds): SPARSE <= 3 KB and <= 20 us encode+decode per request-round.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire.client import DraftClient
from specpair.wire.codec import decode, encode
from specpair.wire.codec.header import VERSION
from specpair.wire.frames import (
    DraftItem,
    Hello,
    ItemStatus,
    ProposalFrame,
    Propose,
    ProposeItem,
    RequestParams,
)
from specpair.wire.server import ServerThread

V, K, TOP = 129_280, 5, 64
KEY = b"bench-key-0123456789abcdef"


def _hello(*kinds: QKind) -> Hello:
    """The HELLO of a SAMPLED drafter of V, K and top-64 sending ``kinds``."""
    return Hello(VERSION, DraftMode.SAMPLED, V, bytes(32), kinds, K, TOP, None)


def _items(b: int) -> dict[str, list[DraftItem]]:
    g = torch.Generator().manual_seed(b)
    sparse, dense = [], []
    for rid in range(b):
        lp = torch.log_softmax(torch.randn(K, V, generator=g) * 3, dim=-1)  # [K, V] fp32
        vals, ids = lp.topk(TOP, dim=-1)
        ids, order = ids.sort(dim=-1)  # ascending ids, as specpair.sampling ships them
        vals = torch.log_softmax(vals.gather(1, order), dim=-1)  # the truncated law
        sparse.append(DraftItem(rid, ItemStatus.OK, ids[:, 0].clone(), QKind.SPARSE, vals, ids))
        dense.append(DraftItem(rid, ItemStatus.OK, lp.argmax(-1), QKind.DENSE, lp, None))
    return {"SPARSE top-64": sparse, "DENSE fp32": dense}


def _codec(b: int) -> dict[str, tuple[int, float, float]]:
    """name -> (bytes, us encode+decode wall median, us CPU time; per request-round)."""
    hello = _hello(QKind.SPARSE, QKind.DENSE)
    frames = {k: ProposalFrame(1, tuple(v)) for k, v in _items(b).items()}
    reps = {"SPARSE top-64": 200, "DENSE fp32": 1}
    samples: dict[str, list[float]] = {k: [] for k in frames}
    cpu: dict[str, list[float]] = {k: [] for k in frames}
    for _ in range(25):  # round-robin; each call timed alone, so a preemption spoils one sample
        for name, frame in frames.items():
            c = time.thread_time()
            for _ in range(reps[name]):
                t = time.perf_counter()
                decode(encode(frame), hello)
                samples[name].append(time.perf_counter() - t)
            cpu[name].append((time.thread_time() - c) / reps[name])
    return {k: (len(encode(f)) / b, statistics.median(samples[k]) / b * 1e6,
                statistics.median(cpu[k]) / b * 1e6) for k, f in frames.items()}


class _Prepared:
    """Handler answering every round with the prepared items, the i-th item of a round
    under the round's i-th request id (the server hands a handler its own ids)."""

    def __init__(self, items: list[DraftItem]) -> None:
        self.items = items

    def handle(self, p: Propose) -> ProposalFrame:
        return ProposalFrame(p.round_id, tuple(replace(d, request_id=it.request_id)
                                               for d, it in zip(self.items, p.items,
                                                                strict=True)))

    def release(self, request_ids: tuple[int, ...]) -> None:
        pass


def _loopback(b: int, kind: str, items: list[DraftItem], rounds: int) -> tuple[float, float]:
    hello = _hello(QKind.SPARSE if kind.startswith("SPARSE") else QKind.DENSE)
    params = RequestParams(1.0, 0, 1.0, 0)
    with ServerThread(_Prepared(items), hello, KEY) as srv, DraftClient(
            "127.0.0.1", srv.port, KEY, vocab_size=V,
            tokenizer_fingerprint=hello.tokenizer_fingerprint) as c:
        lat = []
        for r in range(rounds + 5):
            batch = [ProposeItem(rid, torch.tensor([7]) if r else torch.arange(8), 0,
                                 8 + r, K, params, None) for rid in range(b)]
            t = time.perf_counter()
            out = c.propose(batch, deadline_s=5.0)
            dt = time.perf_counter() - t
            assert all(isinstance(d, DraftItem) for d in out), out
            if r >= 5:  # after connect and warm-up
                lat.append(dt)
    q = statistics.quantiles(lat, n=100)
    return q[49] * 1e3, q[98] * 1e3


def main() -> None:
    print(f"\n## Probability wire per request-round (V={V}, K={K})\n")
    print("| B | q encoding | bytes/request-round | encode+decode us/request-round (wall median) "
          "| encode+decode us/request-round (CPU) | loopback p50 ms | loopback p99 ms |")
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for b in (1, 4):
        codec = _codec(b)
        items = _items(b)
        for name, (nbytes, us, cpu_us) in codec.items():
            rounds = 300 if name.startswith("SPARSE") else 30
            p50, p99 = _loopback(b, name, items[name], rounds)
            rows[(b, name)] = (nbytes, us, p50, p99)
            print(f"| {b} | {name} | {nbytes:,.0f} | {us:,.1f} | {cpu_us:,.1f} | {p50:.3f} "
                  f"| {p99:.3f} |")
    print("\n| B | DENSE / SPARSE: bytes | encode+decode | loopback p50 | loopback p99 |")
    print("|---|---|---|---|---|")
    for b in (1, 4):
        s, d = rows[(b, "SPARSE top-64")], rows[(b, "DENSE fp32")]
        print(f"| {b} | {d[0] / s[0]:,.0f}x | {d[1] / s[1]:,.0f}x | {d[2] / s[2]:,.1f}x "
              f"| {d[3] / s[3]:,.1f}x |")
    s1 = rows[(1, "SPARSE top-64")]
    times = "; ".join(f"{'met' if us <= 20 else 'MISSED'} at B={b}: {us:.1f} us"
                      for b in (1, 4) for us in [rows[(b, "SPARSE top-64")][1]])
    print(f"\nTargets: SPARSE <= 3,072 bytes ({'met' if s1[0] <= 3072 else 'MISSED'}: "
          f"{s1[0]:,.0f}) and <= 20 us encode+decode per request-round ({times}).")


if __name__ == "__main__":
    main()
