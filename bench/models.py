"""Decode step time of the trained pair (models/trained): target vs draft, CPU.

One step = one forward of ONE new token at batch 1 with a KV cache (transformers'
DynamicCache) after a 64-token prompt, as a drafter or a plain decoder runs it. The two
models are timed alternately in the same loop (so a load change hits both), 1 torch thread;
medians over ``STEPS`` steps after ``WARMUP``. The issue's bound: the draft's step costs at
most 1/8 of the target's (docs/models.md).
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache, LlamaForCausalLM

from specpair.models.train import PINNED_DIR

PROMPT = 64
WARMUP = 20
STEPS = 300


class _Decoder:
    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        ids = torch.arange(10, 10 + PROMPT)[None]
        self.tok = self.model(input_ids=ids, past_key_values=self.cache).logits[:, -1:].argmax(-1)

    def step(self) -> float:
        t = time.perf_counter()
        logits = self.model(input_ids=self.tok, past_key_values=self.cache).logits
        dt = time.perf_counter() - t
        self.tok = logits[:, -1:].argmax(-1)
        return dt


def measure(steps: int = STEPS) -> dict[str, float]:
    """Median decode-step milliseconds of the trained target and draft, and their ratio."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            dec = {name: _Decoder(LlamaForCausalLM.from_pretrained(PINNED_DIR / name).eval())
                   for name in ("target", "draft")}
            times: dict[str, list[float]] = {"target": [], "draft": []}
            for i in range(WARMUP + steps):
                for name, d in dec.items():
                    if i and i % 256 == 0:  # stay within the positions the pair was trained on
                        d.reset()
                    dt = d.step()
                    if i >= WARMUP:
                        times[name].append(dt)
    finally:
        torch.set_num_threads(threads)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {"target_ms": ms["target"], "draft_ms": ms["draft"],
            "draft_over_target": ms["draft"] / ms["target"]}


def main() -> None:
    r = measure()
    print(f"\n## Decode step, trained pair (batch 1, KV cache, prompt {PROMPT}, 1 thread, "
          f"median of {STEPS})")
    print("| target ms/step | draft ms/step | draft / target | bound |")
    print("|---|---|---|---|")
    print(f"| {r['target_ms']:.2f} | {r['draft_ms']:.2f} | {r['draft_over_target']:.3f} | "
          f"<= 0.125 |")


if __name__ == "__main__":
    main()
