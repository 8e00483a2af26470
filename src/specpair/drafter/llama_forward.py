"""The draft model's forward for the Llama layout, without transformers' per-call machinery.

A 1-layer draft spends most of a drafter round in ``LlamaForCausalLM.__call__``'s Python,
not in its arithmetic: the 4-D mask built per call, the rotary module, the output objects,
the keyword plumbing (docs/performance.md, "Drafter round cost"). This forward runs the same
modules' weights through the same torch operations in the same order, on a cache with
``DynamicCache.update``'s contract (the drafter's ``specpair.drafter.kv.KV``, or a
``DynamicCache``), so the bits are the same. It mirrors transformers 5's SDPA path, including
where that passes no mask (an all-ones padding mask with one query, or as many queries as
keys: ``is_causal`` then), and computes the head over every fed position as it does (over
fewer rows the matmul rounds differently). ``tests/drafter/test_drafter_bits.py`` pins the
rounds' drafted tokens and q bytes, recorded on the transformers forward;
``tests/drafter/test_llama_forward.py`` compares the two forwards bit for bit on padded
batches, grouped-query attention included.

``LlamaForward.of(model)`` returns None for anything it does not mirror (another
architecture, a RoPE variant or scaling, an attention implementation other than SDPA); the
drafter then calls the model itself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

__all__ = ["LlamaForward"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaForward:
    """``__call__(ids, mask, pos, cache, rows)``: logits [B, V] at ``rows``' positions."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        self.embed = model.model.embed_tokens
        self.layers = list(model.model.layers[: cfg.num_hidden_layers])
        self.norm = model.model.norm
        self.lm_head = model.lm_head
        self.inv_freq = model.model.rotary_emb.inv_freq
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(self.layers[0].self_attn.head_dim)
        self.scaling = float(self.layers[0].self_attn.scaling)

    @classmethod
    def of(cls, model: Any) -> LlamaForward | None:
        cfg = getattr(model, "config", None)
        rope = getattr(cfg, "rope_parameters", None) or {}
        if (cfg is None or getattr(cfg, "model_type", None) != "llama"
                or type(model).__name__ != "LlamaForCausalLM"
                or rope.get("rope_type", "default") != "default"
                or getattr(model.model.rotary_emb, "attention_scaling", 1.0) != 1.0
                or cfg._attn_implementation not in ("sdpa", None)
                or getattr(cfg, "pretraining_tp", 1) != 1):
            return None
        return cls(model)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
                 rows: torch.Tensor | None) -> torch.Tensor:
        """``ids`` [B, T] fed at positions ``pos`` [B, T] after ``cache`` (updated in place),
        ``mask`` [B, L] int over every slot (cache + ids; 0: padding); logits [B, V] at
        position ``rows[b]`` of row b (None: the last)."""
        b, t = ids.shape
        width = mask.shape[1]
        attn = None  # what transformers' create_causal_mask gives SDPA
        if not ((t == 1 or width == t) and bool(mask.all())):
            keys = torch.arange(width, device=ids.device)
            causal = keys[None, :] <= (width - t + torch.arange(t, device=ids.device))[:, None]
            attn = causal[None, None] & mask[:, None, None, :].bool()  # [B, 1, T, L]
        freqs = pos[..., None].float() * self.inv_freq.to(device=ids.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.embed(ids)
        cos = emb.cos().to(x.dtype).unsqueeze(1)
        sin = emb.sin().to(x.dtype).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, attn,
                                    cache, i)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        # the head over every fed position, as transformers computes it: over fewer rows the
        # matmul may round differently (measured), and the pinned bits are the full head's
        logits = self.lm_head(self.norm(x))
        return logits[:, -1] if rows is None else logits[torch.arange(b, device=x.device), rows]

    def _attention(self, attn_mod: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   attn: torch.Tensor | None, cache: Any, i: int) -> torch.Tensor:
        b, t = h.shape[:2]
        shape = (b, t, -1, self.head_dim)
        q = attn_mod.q_proj(h).view(shape).transpose(1, 2)
        k = attn_mod.k_proj(h).view(shape).transpose(1, 2)
        v = attn_mod.v_proj(h).view(shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        k, v = cache.update(k, v, i)
        extra = {}
        groups = self.heads // self.kv_heads
        if groups > 1:
            if attn is None and k.shape[-1] == v.shape[-1] <= 256:
                extra["enable_gqa"] = True
            else:
                k = k.repeat_interleave(groups, dim=1)
                v = v.repeat_interleave(groups, dim=1)
        out = scaled_dot_product_attention(q, k, v, attn_mask=attn, dropout_p=0.0,
                                           scale=self.scaling,
                                           is_causal=t > 1 and attn is None, **extra)
        out = out.transpose(1, 2).contiguous().reshape(b, t, -1).contiguous()
        return attn_mod.o_proj(out)
