"""Decode step time of the trained pair (models/trained): target vs draft, CPU.

One step = one forward of ONE new token at batch 1 with a KV cache (transformers'
DynamicCache) after a 64-token prompt, as a drafter or a plain decoder runs it, through
transformers' forward and through specpair's own Llama forward (what the drafter runs:
``specpair.drafter.llama_forward``, the same bits). The two models are timed alternately in
the same loop (so a load change hits both), 1 torch thread; medians over ``STEPS`` steps
after ``WARMUP``. The bound it checks: the draft's step costs at most 1/8 of the target's
(docs/models.md).
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache, LlamaForCausalLM

from specpair.drafter.llama_forward import LlamaForward
from specpair.models.train import PINNED_DIR

PROMPT = 64
WARMUP = 20
STEPS = 300


class _Decoder:
    """Decode steps of one model through transformers' forward or (``own``) LlamaForward."""

    def __init__(self, model: LlamaForCausalLM, own: bool) -> None:
        self.model, self.forward = model, LlamaForward.of(model) if own else None
        self.reset()

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        if self.forward is None:
            return self.model(input_ids=ids, past_key_values=self.cache).logits[:, -1]
        start = self.cache.get_seq_length()
        pos = torch.arange(start, start + ids.shape[1])[None]
        mask = torch.ones(1, start + ids.shape[1], dtype=torch.long)
        return self.forward(ids, mask, pos, self.cache, None)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.tok = self._logits(torch.arange(10, 10 + PROMPT)[None]).argmax(-1)[:, None]

    def step(self) -> float:
        t = time.perf_counter()
        logits = self._logits(self.tok)
        dt = time.perf_counter() - t
        self.tok = logits.argmax(-1)[:, None]
        return dt


def measure(own: bool, steps: int = STEPS) -> dict[str, float]:
    """Median decode-step milliseconds of the trained target and draft, and their ratio,
    through transformers' forward or (``own``) specpair's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            dec = {name: _Decoder(LlamaForCausalLM.from_pretrained(PINNED_DIR / name).eval(),
                                  own)
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
    print(f"\n## Decode step, trained pair (batch 1, KV cache, prompt {PROMPT}, 1 thread, "
          f"median of {STEPS})")
    print("| forward | target ms/step | draft ms/step | draft / target | bound |")
    print("|---|---|---|---|---|")
    for own, name in ((False, "transformers"), (True, "specpair's (the drafter's)")):
        r = measure(own)
        print(f"| {name} | {r['target_ms']:.2f} | {r['draft_ms']:.2f} | "
              f"{r['draft_over_target']:.3f} | <= 0.125 |")


if __name__ == "__main__":
    main()
