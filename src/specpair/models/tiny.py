"""A deterministic tiny target + draft pair (Llama layout), generated locally.

Both models are plain ``LlamaForCausalLM`` checkpoints (float32, hidden 128,
4 heads of head_dim 32 — the vLLM CPU attention backend takes head sizes 32,
64, 80 and up) sharing one tokenizer (``specpair.models.tokenizer``).

How the draft is correlated with the target: the target has
``TARGET_LAYERS`` decoder layers, the draft is the target's embeddings, first
``DRAFT_LAYERS`` layers, final norm and lm_head, copied bit for bit. The
target's later layers write into the residual stream with a reduced scale
(``LATE_SCALE``), so they perturb rather than replace what the shared layers
computed: the draft's law is close to, but not, the target's.

How the target's laws are shaped: the lm_head scale (``LOGIT_SCALE``) gives
next-token entropies of a few nats at temperature 1 (neither uniform nor
one-hot), and attention logits are scaled up (``QK_SCALE``) so the law
depends on the context. The tests measure both properties and the acceptance
rate; these constants were chosen with those tests.

Every weight is drawn from one ``torch.Generator`` seeded with ``seed``, in the
order of the sorted parameter names, so the files are bit-identical for the
same seed (and torch version).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from specpair.models import tokenizer

__all__ = ["TinySpec", "TinyPair", "make_tiny", "target_config"]

HIDDEN = 128  # model width
HEADS = 4  # attention heads (head_dim 32), no GQA
INTERMEDIATE = 256  # MLP width
TARGET_LAYERS = 4  # decoder layers of the target
DRAFT_LAYERS = 2  # decoder layers of the draft (the target's first ones)
MAX_POSITIONS = 2048  # max_position_embeddings
LATE_SCALE = 0.35  # residual-write scale of the target's layers beyond the draft's
LOGIT_SCALE = 3.0  # std of the target's logits before the final norm's gain
QK_SCALE = 2.0  # extra scale on q/k projections: sharper, context-dependent attention


@dataclass(frozen=True)
class TinySpec:
    """What to generate."""

    seed: int = 0  # seeds every weight
    vocab_size: int = tokenizer.VOCAB_SIZE  # V
    target_layers: int = TARGET_LAYERS  # decoder layers of the target
    draft_layers: int = DRAFT_LAYERS  # decoder layers of the draft (< target_layers)


@dataclass(frozen=True)
class TinyPair:
    """Where the pair was written."""

    target: Path  # HF model directory of the target
    draft: Path  # HF model directory of the draft


def target_config(spec: TinySpec, layers: int) -> dict:
    """config.json of a tiny Llama with ``layers`` decoder layers."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "num_attention_heads": HEADS,
        "num_hidden_layers": layers,
        "num_key_value_heads": HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "dtype": "float32",
        "use_cache": True,
        "vocab_size": spec.vocab_size,
    }


def _shapes(spec: TinySpec) -> dict[str, tuple[int, ...]]:
    h, i, v = HIDDEN, INTERMEDIATE, spec.vocab_size
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(spec.target_layers):
        p = f"model.layers.{n}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        out |= {p + f"self_attn.{x}_proj.weight": (h, h) for x in "qkvo"}
        out |= {p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i)}
    return out


def _scale(name: str, shape: tuple[int, ...], spec: TinySpec) -> float:
    """Standard deviation of a weight (norm gains are 1, handled by the caller)."""
    fan_in = shape[-1]
    base = 1.0 / math.sqrt(fan_in)
    if name == "model.embed_tokens.weight":
        return 1.0
    if name == "lm_head.weight":
        return LOGIT_SCALE * base
    layer = int(name.split(".")[2])
    late = LATE_SCALE if layer >= spec.draft_layers else 1.0
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        return QK_SCALE * base
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return late * base
    return base


def weights(spec: TinySpec) -> dict[str, torch.Tensor]:
    """The target's float32 weights, deterministic in ``spec.seed``."""
    gen = torch.Generator().manual_seed(spec.seed)
    out = {}
    for name, shape in sorted(_shapes(spec).items()):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            w = torch.randn(shape, generator=gen, dtype=torch.float32)
            out[name] = (w * _scale(name, shape, spec)).contiguous()
    return out


def _write_model(directory: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    (directory / "generation_config.json").write_text(
        json.dumps(gen, indent=2, sort_keys=True) + "\n")
    weights_file = directory / "model.safetensors"
    save_file(tensors, str(weights_file), metadata={"format": "pt"})
    weights_file.chmod(0o644)  # safetensors creates it 0600; images run as other users
    tokenizer.save(directory, config["vocab_size"], MAX_POSITIONS)


def make_tiny(out: Path, spec: TinySpec = TinySpec(), *, force: bool = False) -> TinyPair:  # noqa: B008
    """Write ``out/target`` and ``out/draft``; refuses to overwrite unless ``force``."""
    if not 0 <= spec.seed < 2**63:
        raise ValueError(f"seed must lie in [0, 2**63), got {spec.seed}")
    if not 0 < spec.draft_layers < spec.target_layers:
        raise ValueError(f"need 0 < draft_layers < target_layers, got "
                         f"{spec.draft_layers} and {spec.target_layers}")
    out = Path(out)
    pair = TinyPair(target=out / "target", draft=out / "draft")
    for d in (pair.target, pair.draft):
        if d.exists():
            if not force:
                raise FileExistsError(f"{d} exists (pass --force to overwrite)")
            shutil.rmtree(d)
    full = weights(spec)
    keep = {n: t for n, t in full.items()
            if not n.startswith("model.layers.") or int(n.split(".")[2]) < spec.draft_layers}
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".make-tiny-", dir=out))  # nothing half-written
    try:
        _write_model(staging / "target", target_config(spec, spec.target_layers), full)
        _write_model(staging / "draft", target_config(spec, spec.draft_layers), keep)
        (staging / "target").rename(pair.target)
        (staging / "draft").rename(pair.draft)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return pair
