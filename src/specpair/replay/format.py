"""The replay file: recorded per-round target and draft logits (docs/replay-format.md).

A safetensors file with exactly two tensors and string metadata:

- ``target_logits``: [R, K+1, V] fp32/bf16/fp16, the target's logits at the K
  draft positions of each round and at the bonus position;
- ``draft_logits``: [R, K, V], same dtype family, the drafter's logits at the K
  draft positions (position k conditioned on the recorded prefix);
- metadata ``format`` = ``specpair-replay/1``, ``temperature`` (> 0), ``top_k``
  (0 = none), ``top_p`` (1 = none): the sampling params both laws are built with, in the
  domain of ``specpair.sampling.check_params_domain`` (docs/core.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specpair.errors import BadSamplingParams, SpecpairError
from specpair.files import FileRefused, require_regular
from specpair.sampling import check_params_domain

__all__ = ["FORMAT", "ReplayFormatError", "Recording", "load_recording", "save_recording"]

FORMAT = "specpair-replay/1"
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class ReplayFormatError(SpecpairError, ValueError):
    """A replay file does not follow docs/replay-format.md."""


@dataclass(frozen=True)
class Recording:
    """A loaded replay file."""

    target_logits: torch.Tensor  # [R, K+1, V] fp32
    draft_logits: torch.Tensor  # [R, K, V] fp32
    temperature: float  # MIN_TEMPERATURE..MAX_TEMPERATURE (specpair.sampling)
    top_k: int  # 0 = no top-k
    top_p: float  # in (0, 1]; 1 = no top-p

    @property
    def rounds(self) -> int:
        return self.draft_logits.shape[0]

    @property
    def depth(self) -> int:
        return self.draft_logits.shape[1]

    @property
    def vocab(self) -> int:
        return self.draft_logits.shape[2]


def _check(rec: Recording, where: str) -> Recording:
    t, d = rec.target_logits, rec.draft_logits
    if t.ndim != 3 or d.ndim != 3:
        raise ReplayFormatError(f"{where}: target_logits must be [R, K+1, V] and draft_logits "
                                f"[R, K, V]; got {tuple(t.shape)} and {tuple(d.shape)}")
    r, k, v = d.shape
    if t.shape != (r, k + 1, v) or r < 1 or k < 1 or v < 2:
        raise ReplayFormatError(f"{where}: target_logits {tuple(t.shape)} does not match "
                                f"draft_logits {tuple(d.shape)} (need [R, K+1, V], R, K >= 1)")
    for name, x in (("target_logits", t), ("draft_logits", d)):
        if x.dtype not in _FLOATS:
            raise ReplayFormatError(f"{where}: {name} has dtype {x.dtype}; need fp32/bf16/fp16")
        if bool(torch.isnan(x).any()) or bool(torch.isposinf(x).any()):
            raise ReplayFormatError(f"{where}: {name} holds NaN or +inf")
        if bool(torch.isneginf(x).all(dim=-1).any()):
            raise ReplayFormatError(f"{where}: {name} has a row with no finite logit")
    try:
        check_params_domain(rec.temperature, rec.top_k, rec.top_p, where=where)
    except BadSamplingParams as e:
        raise ReplayFormatError(str(e)) from None
    if rec.temperature == 0:
        raise ReplayFormatError(f"{where}: temperature must be > 0 (greedy targets have no "
                                "sampled acceptance law); got 0")
    return Recording(t.float(), d.float(), rec.temperature, rec.top_k, rec.top_p)


def load_recording(path: str | Path) -> Recording:
    """Read and validate a replay file; errors name the file and what is wrong."""
    try:
        require_regular(path, "replay file")  # a FIFO would block safetensors' open
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            meta = f.metadata() or {}
            if names != {"target_logits", "draft_logits"}:
                raise ReplayFormatError(f"{path}: tensors {sorted(names)}; need exactly "
                                        "target_logits and draft_logits")
            t, d = f.get_tensor("target_logits"), f.get_tensor("draft_logits")
    except FileRefused as e:
        raise ReplayFormatError(str(e)) from None
    except (OSError, SafetensorError) as e:
        raise ReplayFormatError(f"cannot read {path}: {e}") from e
    if meta.get("format") != FORMAT:
        raise ReplayFormatError(f"{path}: metadata format is {meta.get('format')!r}, "
                                f"expected {FORMAT!r}")
    try:
        rec = Recording(t, d, float(meta["temperature"]), int(meta["top_k"]),
                        float(meta["top_p"]))
    except (KeyError, ValueError) as e:
        raise ReplayFormatError(f"{path}: metadata needs temperature, top_k, top_p: {e}"
                                ) from e
    return _check(rec, str(path))


def save_recording(path: str | Path, rec: Recording) -> None:
    """Write a replay file (validated first)."""
    rec = _check(rec, str(path))
    save_file({"target_logits": rec.target_logits.contiguous(),
               "draft_logits": rec.draft_logits.contiguous()}, str(path),
              metadata={"format": FORMAT, "temperature": repr(rec.temperature),
                        "top_k": str(rec.top_k), "top_p": repr(rec.top_p)})
