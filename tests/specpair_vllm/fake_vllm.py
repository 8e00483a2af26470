"""The V1 proposer and the V2 speculator built on stand-ins for vLLM's config and state
objects (the fields they read), for the adapter and drafting tests; no engine."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from fake_source import K, V


def v1_proposer(max_reqs: int = 4):
    """specpair.vllm.v1.RemoteProposer for K drafts over V tokens."""
    from specpair.vllm.v1 import RemoteProposer

    spec = SimpleNamespace(num_speculative_tokens=K)
    model = SimpleNamespace(get_vocab_size=lambda: V, max_model_len=64, tokenizer="unused")
    cfg = SimpleNamespace(speculative_config=spec, model_config=model,
                          scheduler_config=SimpleNamespace(max_num_seqs=max_reqs))
    return RemoteProposer(cfg)


def v2_speculator(depth: int = K, max_reqs: int = 4, method: str = "standard"):
    """(specpair.vllm.v2.RemoteSpeculator, its request states: total_len and all_token_ids
    [max_reqs, 64] int32 as V2's ``.gpu`` tensors)."""
    from specpair.vllm.v2 import RemoteSpeculator

    spec = SimpleNamespace(num_speculative_tokens=depth, rejection_sample_method=method,
                           enable_adaptive_verification=False)
    model = SimpleNamespace(get_vocab_size=lambda: V, max_model_len=64, tokenizer="unused")
    cfg = SimpleNamespace(speculative_config=spec, model_config=model,
                          scheduler_config=SimpleNamespace(max_num_seqs=max_reqs))
    tokens = torch.zeros(max_reqs, 64, dtype=torch.int32)
    total = torch.zeros(max_reqs, dtype=torch.int32)
    states = SimpleNamespace(total_len=SimpleNamespace(gpu=total),
                             all_token_ids=SimpleNamespace(gpu=tokens))
    return RemoteSpeculator(cfg, torch.device("cpu"), states), states


def v2_batch(req_ids: list[str], idx: list[int], qs: list[int]):
    """V2's input batch: request ids, their state rows and query start locations."""
    return SimpleNamespace(num_reqs=len(req_ids), req_ids=req_ids,
                           idx_mapping=torch.tensor(idx), idx_mapping_np=torch.tensor(idx).numpy(),
                           query_start_loc_np=torch.tensor(qs).numpy())
