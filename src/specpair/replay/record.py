"""Record a replay file from a local target/draft model pair (HF causal LM directories).

Prompts are either given (``prompt_ids``, [N, L] token ids, e.g. windows of held-out text:
``bench/replay.py``) or random: ``prompts`` rows of id 1 (the BOS of both local tokenizers)
and ``prompt_len`` random ids. All N prompts are continued together (one batch, KV cache)
by ``tokens`` tokens sampled from the target's processed law (``process_logits`` with the
given params, seeded ``torch.Generator``). Both models are then run once over the whole
sequences (teacher forcing), and each sequence is cut into rounds of K+1 positions,
non-overlapping (so rounds are as independent as one sequence allows): round s records the
target's logits predicting positions s..s+K and the draft's predicting s..s+K-1. As in
every offline replay, draft position k is conditioned on the committed tokens, not on the
drafts before it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpair.replay.format import Recording
from specpair.sampling import SamplingParams, process_logits

__all__ = ["record_from_models"]


@torch.no_grad()
def record_from_models(target_dir: str | Path, draft_dir: str | Path, *, prompts: int = 0,
                       tokens: int, depth: int, temperature: float, top_k: int = 0,
                       top_p: float = 1.0, seed: int = 0, prompt_len: int = 7,
                       prompt_ids: torch.Tensor | None = None) -> Recording:
    """A ``Recording`` of ``N * ((tokens - depth - 1) // (depth + 1) + 1)`` rounds."""
    from transformers import AutoModelForCausalLM  # heavy; only when recording

    if prompt_ids is not None and (prompt_ids.ndim != 2 or prompt_ids.shape[1] < 1):
        raise ValueError(f"prompt_ids must be [N, L >= 1], got shape {tuple(prompt_ids.shape)}")
    n = prompts if prompt_ids is None else prompt_ids.shape[0]
    if depth < 1 or tokens < depth + 1 or n < 1:
        raise ValueError("need depth >= 1, tokens >= depth + 1 and at least one prompt")
    target = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, local_files_only=True).eval()
    vocab = target.config.vocab_size
    if draft.config.vocab_size != vocab:
        raise ValueError(f"target vocabulary {vocab} != draft vocabulary "
                         f"{draft.config.vocab_size}")
    params = SamplingParams.make(n, temperature, top_k, top_p)
    gen = torch.Generator().manual_seed(seed)
    if prompt_ids is None:
        seq = torch.cat([torch.ones(n, 1, dtype=torch.int64),
                         torch.randint(10, vocab, (n, prompt_len), generator=gen)], dim=1)
    else:
        seq = prompt_ids.to(torch.int64)
        if not 0 <= int(seq.min()) <= int(seq.max()) < vocab:
            raise ValueError(f"prompt_ids must be token ids in 0..{vocab - 1}")
    start = seq.shape[1]
    past, step_in = None, seq
    for _ in range(tokens):
        out = target(step_in, past_key_values=past, use_cache=True)
        past = out.past_key_values
        probs = process_logits(out.logits[:, -1].float(), params).exp()
        step_in = torch.multinomial(probs, 1, generator=gen)  # [N, 1]
        seq = torch.cat([seq, step_in], dim=1)
    t_logits = target(seq).logits.float()  # [N, L, V]; row j predicts token j+1
    d_logits = draft(seq).logits.float()
    t_rounds, d_rounds = [], []
    for i in range(n):
        for s in range(start, seq.shape[1] - depth, depth + 1):
            t_rounds.append(t_logits[i, s - 1:s + depth])  # predicts s..s+K: [K+1, V]
            d_rounds.append(d_logits[i, s - 1:s + depth - 1])  # predicts s..s+K-1: [K, V]
    return Recording(torch.stack(t_rounds), torch.stack(d_rounds), temperature, top_k, top_p)
