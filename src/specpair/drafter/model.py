"""The drafter's model interface, and its implementation for a local HF causal LM.

The engine talks to a draft model through two calls per round:

    session, logits = model.begin(rows)   # ONE forward over every row's new tokens
    logits = session.step(d)              # ONE forward per draft step, d [B] int64
    caches = session.finish()             # per-row caches, now covering what was fed

``rows[b].cache`` holds the row's past (``start`` tokens, already cropped to
the committed prefix the engine wants to keep); ``rows[b].tokens`` are fed at
absolute positions ``start, start+1, ...``; ``rows[b].features`` are the
target's context features for exactly those tokens (``[n, width]``) when the
model declared a ``feature_spec``, else None. Draft tokens fed by ``step`` have
no target features.

``HFDraftModel`` batches B rows with different past lengths into one forward:
the rows' caches (``specpair.drafter.kv.KV``) are stacked left-padded to a common
length, the new tokens right-padded to a common count, and an attention mask
(0 on every padding slot) plus explicit position ids keep each row's attention
and RoPE exactly what they would be alone. Right-padding the new tokens means
every padding query follows at least one real token of its row, so no query
row is fully masked (which would put NaNs into the cache). After the last step
the slots the round added to each row are appended to the row's own cache. A round of one
row (B = 1) has no padding: its cache is fed in place and returned as it is, with no
stacking or copy. A Llama-layout model runs through ``specpair.drafter.llama_forward``
(the same operations without transformers' per-call machinery); any other model through
its own forward, handed the cache as a ``DynamicCache``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from specpair.drafter.errors import ModelLoadError
from specpair.drafter.kv import KV
from specpair.drafter.llama_forward import LlamaForward
from specpair.wire.frames import FeatureSpec

__all__ = ["Row", "DraftForward", "DraftModel", "HFDraftModel", "HFForward", "cache_length"]

_MASK_SPARE = 32  # mask columns allocated for draft steps (docs/wire.md: K <= 32)


@dataclass(frozen=True)
class Row:
    """One request's input to ``DraftModel.begin``."""

    cache: Any  # the model's cache of this request's first ``start`` tokens; None if start == 0
    start: int  # absolute position of tokens[0] (= tokens already in ``cache``)
    tokens: torch.Tensor  # [n >= 1] int64 tokens to feed
    features: torch.Tensor | None  # [n, width] target features of ``tokens``, or None


class DraftForward(Protocol):
    """One batched forward in progress: the rows begun together, stepped one token a row."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([B] int64); logits [B, V] of the next position."""

    def finish(self) -> list[Any]:
        """Per-row caches covering everything fed (past + tokens + stepped drafts)."""


class DraftModel(Protocol):
    vocab_size: int  # V
    max_positions: int  # positions the model can attend over
    feature_spec: FeatureSpec | None  # target features it needs (None: none)

    def begin(self, rows: Sequence[Row]) -> tuple[DraftForward, torch.Tensor]:
        """Feed every row's tokens in one forward; (the forward, logits [B, V] after each row)."""

    def crop(self, cache: Any, length: int) -> Any:
        """The cache of the first ``length`` tokens (may modify ``cache`` in place)."""


def cache_length(cache: KV | None) -> int:
    return 0 if cache is None else cache.get_seq_length()


class HFDraftModel:
    """A local Hugging Face causal LM (offline) as a draft model; ignores features."""

    feature_spec = None  # a standalone draft LM does not condition on the target

    def __init__(self, path: Path, device: str = "cpu", dtype: torch.dtype | None = None) -> None:
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a Hugging Face model directory (no config.json)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=dtype or "auto").to(device).eval()
        except (OSError, ValueError, RuntimeError) as e:
            raise ModelLoadError(f"cannot load the draft model from {path}: {e}") from e
        self.device = torch.device(device)
        self.vocab_size = int(config.vocab_size)
        self.max_positions = int(getattr(config, "max_position_embeddings", 2**31))
        self.pad_id = int(config.pad_token_id if config.pad_token_id is not None else 0)
        layers = int(config.num_hidden_layers)
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None)
                       or config.hidden_size // config.num_attention_heads)
        size = next(self.model.parameters()).element_size()
        self.kv_bytes_per_token = 2 * layers * heads * head_dim * size  # keys and values
        self.forward = LlamaForward.of(self.model) or HFForward(self.model)

    @torch.inference_mode()
    def begin(self, rows: Sequence[Row]) -> tuple[_HFSession, torch.Tensor]:
        assert rows and all(r.tokens.ndim == 1 and r.tokens.numel() > 0 for r in rows)
        b = len(rows)
        past = [cache_length(r.cache) for r in rows]
        assert past == [r.start for r in rows], (past, [r.start for r in rows])
        n = [r.tokens.numel() for r in rows]
        p_max, t_max = max(past), max(n)
        dev = self.device
        if b == 1:  # no padding: the tokens as they are, a mask of ones
            ids = rows[0].tokens.unsqueeze(0)
            pos = torch.arange(past[0], past[0] + n[0]).unsqueeze(0)
            mask = torch.ones((1, p_max + t_max + _MASK_SPARE), dtype=torch.int64)
        else:
            ids = torch.full((b, t_max), self.pad_id, dtype=torch.int64)
            mask = torch.zeros((b, p_max + t_max + _MASK_SPARE), dtype=torch.int64)
            for i, r in enumerate(rows):
                ids[i, : n[i]] = r.tokens
                mask[i, p_max - past[i]: p_max + n[i]] = 1
            mask[:, p_max + t_max:] = 1  # the slots draft steps will fill
            nt = torch.tensor(n).unsqueeze(1)
            pos = torch.tensor(past).unsqueeze(1) + torch.minimum(torch.arange(t_max), nt - 1)
        if b == 1:  # nothing to pad or stack: fed in place (finish returns it)
            cache = rows[0].cache if rows[0].cache is not None else KV()
        else:
            cache = KV.stack([r.cache for r in rows], past, t_max)
        mask = mask.to(dev)
        width = p_max + t_max
        last = None if b == 1 else torch.tensor(n, device=dev) - 1  # each row's last token
        logits = self.forward(ids.to(dev), mask[:, :width], pos.to(dev), cache, last)
        next_pos = torch.tensor([r.start + k for r, k in zip(rows, n, strict=True)], device=dev)
        session = _HFSession(self.forward, cache, mask, width, next_pos,
                             [r.cache for r in rows], p_max)
        return session, logits.float().cpu()

    def crop(self, cache: KV, length: int) -> KV | None:
        if length == 0:
            return None
        cache.crop(length)
        return cache


class _HFSession:
    """The draft steps of one round. ``mask`` is a buffer of the round's attention mask with
    spare columns of ones past ``width``, the slots the steps fill: each step's mask is a
    view of its first ``width`` + 1 columns (the same values as padding a column of ones on
    each step, without a new tensor per step), reallocated only past _MASK_SPARE steps."""

    def __init__(self, forward: Any, cache: KV, mask: torch.Tensor, width: int,
                 next_pos: torch.Tensor, rows: list[KV | None], p_max: int) -> None:
        self.forward, self.cache, self.next_pos = forward, cache, next_pos
        self.buf, self.width = mask, width
        self.rows, self.p_max = rows, p_max  # the rows' own caches, their stacked pasts' end

    @property
    def mask(self) -> torch.Tensor:
        """[B, L] the mask over every slot fed so far (past, tokens, stepped drafts)."""
        return self.buf[:, : self.width]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        dev = self.buf.device
        self.width += 1
        if self.width > self.buf.shape[1]:
            self.buf = torch.nn.functional.pad(self.buf, (0, _MASK_SPARE), value=1)
        logits = self.forward(tokens.to(dev).unsqueeze(1), self.mask,
                              self.next_pos.unsqueeze(1), self.cache, None)
        self.next_pos = self.next_pos + 1
        return logits.float().cpu()

    @torch.inference_mode()  # a row's cache, made in a round of its own, is an inference tensor
    def finish(self) -> list[KV]:
        if self.buf.shape[0] == 1:  # one row never has padding slots: its cache as it is
            return [self.cache]
        added = self.mask[:, self.p_max:].bool()  # [B, slots] the round's slots, real or pad
        return [self.cache.merge(b, added[b].nonzero().squeeze(1) + self.p_max, into)
                for b, into in enumerate(self.rows)]


class HFForward:
    """Any causal LM through its own forward (``LlamaForward``'s signature), handed the
    cache's filled slots as a ``DynamicCache``; what the forward appends goes into the
    cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                 cache: KV, rows: torch.Tensor | None) -> torch.Tensor:
        n = cache.get_seq_length()
        dc = (DynamicCache(ddp_cache_data=[cache.view(i) for i in range(len(cache.bufs))])
              if n else DynamicCache(config=self.model.config))
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         past_key_values=dc, use_cache=True)
        for i, layer in enumerate(dc.layers):
            cache.update(layer.keys[:, :, n:], layer.values[:, :, n:], i)
        if rows is None:
            return out.logits[:, -1]
        return out.logits[torch.arange(ids.shape[0], device=ids.device), rows]  # [B, V]
