"""Record a replay file from a local target/draft model pair (HF causal LM directories).

For each of ``prompts`` sequences: a random prompt of ``prompt_len`` token ids
(after id 1, the BOS of the tiny tokenizer) is continued by ``tokens`` tokens
sampled from the target's processed law (``process_logits`` with the given
params, seeded ``torch.Generator``). Both models are then run once over the
whole sequence (teacher forcing), and the sequence is cut into rounds of K+1
positions, non-overlapping (so rounds are as independent as one sequence
allows): round s records the target's logits predicting positions s..s+K and
the draft's predicting s..s+K-1. As in every offline replay, draft position k
is conditioned on the committed tokens, not on the drafts before it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpair.replay.format import Recording
from specpair.sampling import SamplingParams, process_logits

__all__ = ["record_from_models"]


@torch.no_grad()
def record_from_models(target_dir: str | Path, draft_dir: str | Path, *, prompts: int,
                       tokens: int, depth: int, temperature: float, top_k: int = 0,
                       top_p: float = 1.0, seed: int = 0, prompt_len: int = 7) -> Recording:
    """A ``Recording`` of about ``prompts * tokens / (depth + 1)`` rounds."""
    from transformers import AutoModelForCausalLM  # heavy; only when recording

    if depth < 1 or tokens < depth + 1 or prompts < 1:
        raise ValueError("need depth >= 1, tokens >= depth + 1 and prompts >= 1")
    target = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, local_files_only=True).eval()
    vocab = target.config.vocab_size
    if draft.config.vocab_size != vocab:
        raise ValueError(f"target vocabulary {vocab} != draft vocabulary "
                         f"{draft.config.vocab_size}")
    params = SamplingParams.make(1, temperature, top_k, top_p)
    gen = torch.Generator().manual_seed(seed)
    t_rounds, d_rounds = [], []
    for _ in range(prompts):
        seq = torch.cat([torch.ones(1, dtype=torch.int64),
                         torch.randint(10, vocab, (prompt_len,), generator=gen)])
        start = seq.numel()
        past = None
        step_in = seq[None]
        for _ in range(tokens):
            out = target(step_in, past_key_values=past, use_cache=True)
            past = out.past_key_values
            probs = process_logits(out.logits[:, -1].float(), params).exp()
            nxt = torch.multinomial(probs, 1, generator=gen)  # [1, 1]
            seq = torch.cat([seq, nxt[0]])
            step_in = nxt
        t_logits = target(seq[None]).logits[0].float()  # [L, V]; row j predicts token j+1
        d_logits = draft(seq[None]).logits[0].float()
        for s in range(start, seq.numel() - depth, depth + 1):
            t_rounds.append(t_logits[s - 1:s + depth])  # predicts s..s+K: [K+1, V]
            d_rounds.append(d_logits[s - 1:s + depth - 1])  # predicts s..s+K-1: [K, V]
    return Recording(torch.stack(t_rounds), torch.stack(d_rounds), temperature, top_k, top_p)
