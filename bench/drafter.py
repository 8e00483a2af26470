"""Drafter engine round latency on the tiny pair's draft model (CPU).

One round = one PROPOSE answered: fold each request's committed tokens into its
cache, then K draft steps, each ONE batched forward plus the sampling core.
B in {1, 4, 16}, K = 3, temperature 1, steady state (each request commits the
drafts it "accepted" plus one token per round, so caches are cropped and
extended as in serving). Batched (one round for B requests) and sequential (B
one-request rounds) are timed alternately in the same loop; medians reported.
Runs with 1 torch thread (as the tests' drafter does): a 128-wide model gains
nothing from more, and on a shared 2-core box extra OpenMP threads spin.

The second table: the committed trained draft's round with the drafter's own Llama forward
(specpair.drafter.llama_forward, as served) against the same model through transformers'
``LlamaForCausalLM`` forward, two engines driven by the same script with their rounds
alternating in one loop (the rounds' bits are the same: tests/drafter/test_llama_forward.py).
The third: what top-p 0.9 adds to the trained draft's round, against T = 1 alone. The
fourth: the round with the drafter's own truncation (``--draft-top-k``: q its top k, shipped
SPARSE) against its untruncated law (a dense row of V at T = 1).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from specpair.drafter.engine import DrafterEngine
from specpair.drafter.model import HFDraftModel, HFForward
from specpair.models.tiny import make_tiny
from specpair.wire.frames import Propose, ProposeItem, RequestParams

K = 3
ROUNDS = 20
PROMPT = 32
TRAINED = Path(__file__).resolve().parents[1] / "models" / "trained" / "draft"


class _Target:
    """Drives one engine like a target would: committed tokens per request."""

    def __init__(self, engine: DrafterEngine, b: int, seed: int, k: int = K,
                 top_p: float = 1.0) -> None:
        self.engine, self.rng, self.k, self.top_p = engine, random.Random(seed), k, top_p
        self.hist = {r: [1] + [self.rng.randrange(10, 512) for _ in range(PROMPT - 1)]
                     for r in range(b)}
        self.new = {r: list(h) for r, h in self.hist.items()}
        self.acc = dict.fromkeys(self.hist, 0)
        self.round = 0

    def items(self, ids: list[int]) -> tuple[ProposeItem, ...]:
        return tuple(ProposeItem(r, torch.tensor(self.new[r]), self.acc[r], len(self.hist[r]),
                                 self.k, RequestParams(1.0, 0, self.top_p, r), None) for r in ids)

    def answer(self, got) -> None:  # noqa: ANN001
        for it in got.items:
            n = self.rng.randrange(0, self.k + 1)
            self.acc[it.request_id] = n
            self.new[it.request_id] = it.tokens[:n].tolist() + [self.rng.randrange(10, 512)]
            self.hist[it.request_id] += self.new[it.request_id]

    def request(self, ids: list[int]) -> Propose:
        """The next round's PROPOSE for the given requests."""
        self.round += 1
        return Propose(self.round - 1, self.items(ids))

    def run(self, ids: list[int]) -> float:
        frame = self.request(ids)
        t = time.perf_counter()
        got = self.engine.handle(frame)
        dt = time.perf_counter() - t
        self.answer(got)
        return dt


def main() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _table()
        _draft_top_k_table()
    finally:
        torch.set_num_threads(threads)


def _table() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pair = make_tiny(Path(tmp))
        model = HFDraftModel(pair.draft)
    print(f"\n## Drafter round latency, tiny draft model (K={K}, T=1, prompt {PROMPT}, "
          f"median of {ROUNDS}, {torch.get_num_threads()} threads)\n")
    print("| B | batched ms/round | ms/draft step | ms/request-round | sequential ms/round "
          "| batched vs sequential |")
    print("|---|---|---|---|---|---|")
    for b in (1, 4, 16):
        batched = _Target(DrafterEngine(model, tokenizer_fingerprint=bytes(32), wire_version=1),
                          b, seed=b)
        seq = _Target(DrafterEngine(model, tokenizer_fingerprint=bytes(32), wire_version=1),
                      b, seed=b)
        tb, ts = [], []
        for i in range(ROUNDS + 2):  # first two rounds (prompt prefill) are warm-up
            x = batched.run(list(range(b)))
            y = sum(seq.run([r]) for r in range(b))
            if i >= 2:
                tb.append(x)
                ts.append(y)
        mb, ms = statistics.median(tb) * 1e3, statistics.median(ts) * 1e3
        print(f"| {b} | {mb:.2f} | {mb / K:.2f} | {mb / b:.2f} | {ms:.2f} | {mb / ms:.2f}x |")
    _forward_table()


def _forward_table(rounds: int = 60) -> None:
    own, hf = HFDraftModel(TRAINED), HFDraftModel(TRAINED)
    hf.forward = HFForward(hf.model)
    print(f"\n## Drafter round, trained draft: specpair's Llama forward vs transformers' "
          f"(T=1, prompt {PROMPT}, {rounds} alternating rounds each, median [min-max])\n")
    print("| B | K | own forward ms/round | transformers ms/round | own / transformers |")
    print("|---|---|---|---|---|")
    for b, k in ((1, 3), (1, 5), (4, 3), (4, 5)):
        times = _alternate([_Target(DrafterEngine(m, tokenizer_fingerprint=bytes(32),
                                                  wire_version=1), b, seed=b, k=k)
                            for m in (own, hf)], b, rounds)
        (a, h) = (statistics.median(t) for t in times)
        cells = [_ms(t) for t in times]
        print(f"| {b} | {k} | {cells[0]} | {cells[1]} | {a / h:.2f}x |")
    _top_p_table()


def _ms(times: list[float]) -> str:
    """Round times (ms) as a table cell: median [min-max]."""
    return f"{statistics.median(times):.2f} [{min(times):.2f}-{max(times):.2f}]"


def _alternate(targets: list[_Target], b: int, rounds: int) -> list[list[float]]:
    """Each target's round times (ms) for requests 0..b-1, ``rounds`` each, the two
    targets' rounds alternating (which goes first, too), after two warm-up rounds (the
    prompt's prefill)."""
    times: list[list[float]] = [[], []]
    for i in range(rounds + 2):
        for j in (0, 1) if i % 2 else (1, 0):
            dt = targets[j].run(list(range(b)))
            if i >= 2:
                times[j].append(dt * 1e3)
    return times


def _top_p_table(rounds: int = 60) -> None:
    """What top-p costs a round: the trained draft's rounds at top-p 0.9 and at T = 1 alone,
    alternating (the sampling core ranks each request's row at every position; the live
    bench's c = 16 top-p rounds took about twice its T = 1 ones)."""
    model = HFDraftModel(TRAINED)
    print(f"\n## Drafter round, trained draft: top-p 0.9 vs T = 1 alone (K={K}, prompt "
          f"{PROMPT}, {rounds} alternating rounds each, median [min-max])\n")
    print("| B | top-p ms/round | T = 1 ms/round | top-p / T = 1 |")
    print("|---|---|---|---|")
    for b in (1, 4, 16):
        times = _alternate([_Target(DrafterEngine(model, tokenizer_fingerprint=bytes(32),
                                                  wire_version=1), b, seed=b, top_p=p)
                            for p in (0.9, 1.0)], b, rounds)
        (a, t) = (statistics.median(x) for x in times)
        cells = [_ms(x) for x in times]
        print(f"| {b} | {cells[0]} | {cells[1]} | {a / t:.2f}x |")


def _draft_top_k_table(rounds: int = 60) -> None:
    """The trained draft's rounds with ``--draft-top-k`` k and without, alternating, T = 1
    and top-p 0.9 (what the truncation saves or costs the drafter; its cost in acceptance is
    bench/replay.py's)."""
    model = HFDraftModel(TRAINED)
    print(f"\n## Drafter round, trained draft: --draft-top-k k vs off (K={K}, prompt {PROMPT}, "
          f"{rounds} alternating rounds each, median [min-max])\n")
    print("| sampling | B | k | with k ms/round | off ms/round | with / off |")
    print("|---|---|---|---|---|---|")
    for p in (1.0, 0.9):
        for b in (1, 4, 16):
            for k in (64, 256):
                times = _alternate([_Target(DrafterEngine(model, tokenizer_fingerprint=bytes(32),
                                                          wire_version=1, draft_top_k=top_k),
                                            b, seed=b, top_p=p) for top_k in (k, 0)], b, rounds)
                (a, t) = (statistics.median(x) for x in times)
                cells = [_ms(x) for x in times]
                sampling = "T = 1" if p == 1.0 else f"top-p {p:g}"
                print(f"| {sampling} | {b} | {k} | {cells[0]} | {cells[1]} | {a / t:.2f}x |")


if __name__ == "__main__":
    main()
