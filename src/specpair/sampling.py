"""Sampling parameters and the exact law they define over a vocabulary.

The same processing is applied to draft logits (giving q) and to target
logits (giving p), so both sides of verification agree on what "the law of a
request" means:

1. temperature T > 0: scale logits by 1/T (T == 0 means greedy: argmax);
2. top-k (k > 0): keep the k largest scaled logits (ties broken by
   ``torch.topk``'s order, deterministically for a given input);
3. top-p (p < 1): keep the smallest prefix of the remaining tokens, in
   descending probability, whose mass reaches p (at least one token), and any token
   exactly as likely as its last (a tie is kept whole, whatever a sort's order);
4. renormalize: log-softmax over the kept tokens, -inf elsewhere.

All arithmetic is fp32 on entry (``logits.float()``), matching vLLM's sampler.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

from specpair.errors import BadSamplingParams

__all__ = [
    "MIN_TEMPERATURE",
    "MAX_TEMPERATURE",
    "MAX_TOP_K",
    "check_params_domain",
    "SamplingParams",
    "process_logits",
    "truncated_law",
    "sample_from_logp",
    "sample_from_weights",
]


# The domain of one request's sampling parameters (docs/core.md). Outside it the law is not
# defined in fp32: T = 1e-40 scales logits to inf and every row to NaN.
MIN_TEMPERATURE = 1e-5  # smallest T > 0 (vLLM samples greedily below it); logits / T stays finite
MAX_TEMPERATURE = 100.0  # largest T; the law is then all but uniform
MAX_TOP_K = 2**63 - 1  # top_k is an int64 (0 = off; k >= V keeps the whole vocabulary)
_I64 = (-(2**63), 2**63 - 1)


def _f32(x: float) -> float:
    """x rounded to fp32 (|x| < 3.4e38)."""
    return _F32.unpack(_F32.pack(x))[0]


_F32 = struct.Struct("<f")
_F32_MIN_T, _F32_MAX_T = _f32(MIN_TEMPERATURE), _f32(MAX_TEMPERATURE)  # the bounds in fp32


def check_params_domain(temperature: float, top_k: int, top_p: float, seed: int = 0,
                        where: str = "") -> None:
    """Raise BadSamplingParams unless one request's params lie in the documented domain.

    temperature: 0 (greedy) or MIN_TEMPERATURE..MAX_TEMPERATURE, compared in fp32 (the
    precision it is used in, so an fp32 tensor row and its float agree); top_k: 0..MAX_TOP_K (an
    integer); top_p: (0, 1], and still > 0 in fp32; seed: a signed 64-bit integer.
    """
    at = f"{where}: " if where else ""
    t = temperature
    if not (isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            and (t == 0 or (0 < t < 2 * MAX_TEMPERATURE  # then in fp32, as it is used
                            and _F32_MIN_T <= _f32(t) <= _F32_MAX_T))):
        raise BadSamplingParams(f"{at}temperature {t!r} must be 0 (greedy) or lie in "
                                f"[{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]")
    if not (isinstance(top_k, int) and not isinstance(top_k, bool) and 0 <= top_k <= MAX_TOP_K):
        raise BadSamplingParams(f"{at}top_k {top_k!r} must be an integer in 0..2^63 - 1 "
                                "(0 = off)")
    if not (isinstance(top_p, int | float) and not isinstance(top_p, bool) and 0 < top_p <= 1
            and _f32(top_p) > 0):  # False for NaN
        raise BadSamplingParams(f"{at}top_p {top_p!r} must lie in (0, 1] (1 = off) and be > 0 "
                                "in fp32")
    if not (isinstance(seed, int) and _I64[0] <= seed <= _I64[1]):
        raise BadSamplingParams(f"{at}seed {seed!r} must be a signed 64-bit integer")


def _outside_domain(temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor) -> torch.Tensor:
    """[B] bool: rows outside ``check_params_domain`` (the same bounds, as one tensor pass,
    for batches: fp32 temperature and top_p, int64 top_k and seed are their own types)."""
    t = temperature
    t_ok = (t == 0) | ((t >= MIN_TEMPERATURE) & (t <= MAX_TEMPERATURE))  # False for NaN
    return ~(t_ok & (top_k >= 0) & (top_p > 0) & (top_p <= 1))


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters of a batch of B requests, each row in the domain of
    ``check_params_domain`` (docs/core.md; BadSamplingParams otherwise)."""

    temperature: torch.Tensor  # [B] fp32; 0 = greedy
    top_k: torch.Tensor  # [B] int64; 0 = no top-k
    top_p: torch.Tensor  # [B] fp32 in (0, 1]; 1 = no top-p
    seed: torch.Tensor  # [B] int64; the Philox key of the request's noise streams

    def __post_init__(self) -> None:
        b = self.temperature.shape
        for name in ("top_k", "top_p", "seed"):
            if getattr(self, name).shape != b:
                raise ValueError(f"SamplingParams.{name} has shape "
                                 f"{tuple(getattr(self, name).shape)}, expected {tuple(b)}")
        if len(b) != 1:
            raise ValueError(f"SamplingParams fields must be 1-D [B], got {tuple(b)}")
        bad = _outside_domain(self.temperature, self.top_k, self.top_p)
        if bool(bad.any()):  # the documented message, from the one check of the domain
            b = int(bad.nonzero()[0, 0])
            check_params_domain(float(self.temperature[b]), int(self.top_k[b]),
                                float(self.top_p[b]), int(self.seed[b]), where=f"row {b}")
            raise AssertionError("_outside_domain and check_params_domain disagree")

    @classmethod
    def make(
        cls,
        batch: int,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | list[int] = 0,
    ) -> SamplingParams:
        """Uniform params for a batch; ``seed`` may be a list of per-request seeds."""
        seeds = torch.as_tensor(seed, dtype=torch.int64)
        if seeds.ndim == 0:
            seeds = seeds.expand(batch).clone()
        return cls(
            temperature=torch.full((batch,), float(temperature), dtype=torch.float32),
            top_k=torch.full((batch,), int(top_k), dtype=torch.int64),
            top_p=torch.full((batch,), float(top_p), dtype=torch.float32),
            seed=seeds,
        )

    @property
    def batch(self) -> int:
        return self.temperature.shape[0]

    @property
    def greedy(self) -> torch.Tensor:
        """[B] bool: requests sampled by argmax."""
        return self.temperature == 0

    def truncated(self) -> torch.Tensor:
        """[B] bool: requests whose law is truncated (top-k or top-p active, not greedy)."""
        return ~self.greedy & ((self.top_k > 0) | (self.top_p < 1))

    def select(self, rows: torch.Tensor) -> SamplingParams:
        """The params of the given rows (an index or bool mask)."""
        return SamplingParams(self.temperature[rows], self.top_k[rows], self.top_p[rows],
                              self.seed[rows])

    def expand(self, n: int) -> SamplingParams:
        """Each request's params repeated n times (rows of [B, n] flattened to [B*n])."""
        return SamplingParams(*(t.repeat_interleave(n) for t in
                                (self.temperature, self.top_k, self.top_p, self.seed)))


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities of the processed law.

    logits: [B, V] or [B, N, V] (params per request b, shared over N).
    Returns fp32 log-probs of the same shape, -inf outside the support.
    Greedy rows (T == 0) get the point mass at the argmax (log 1 = 0).
    Truncated rows equal ``truncated_law`` scattered into the vocabulary.
    """
    assert logits.ndim in (2, 3) and logits.shape[0] == params.batch, (
        f"logits {tuple(logits.shape)} vs batch {params.batch}")
    sparse = params.truncated() | params.greedy
    if not bool(sparse.any()):  # the common case: temperature only, one fused pass
        x = _scaled(logits, params)
        if x is logits or x.requires_grad:
            return torch.log_softmax(x, dim=-1)
        # x is this call's own scaled copy: normalize it in place (the kernel reads each row
        # before it writes it; the result is bit-identical) instead of allocating another.
        return torch.log_softmax(x, dim=-1, out=x)
    if logits.ndim == 3:
        b, n, v = logits.shape
        return process_logits(logits.reshape(b * n, v), params.expand(n)).reshape(b, n, v)
    out = torch.full(logits.shape, float("-inf"), dtype=torch.float32, device=logits.device)
    rows = sparse.nonzero().squeeze(1)
    vals, ids = truncated_law(logits[rows], params.select(rows))
    valid = ids >= 0  # padding re-writes column 0, so each index gets one value
    out[rows] = out[rows].scatter(1, torch.where(valid, ids, ids[:, :1]),
                                  torch.where(valid, vals, vals[:, :1]))
    if not bool(sparse.all()):
        dense = (~sparse).nonzero().squeeze(1)
        out[dense] = torch.log_softmax(_scaled(logits[dense], params.select(dense)), dim=-1)
    return out


def truncated_law(
    logits: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse form of the processed law, for rows that are truncated or greedy.

    logits: [B, V]. Returns (log q [B, S] fp32, ids [B, S] int64), in ascending
    id order, padded with (-inf, -1) after each row's support.
    Greedy rows are the point mass at ``logits.argmax``.
    """
    assert bool((params.truncated() | params.greedy).all()), "rows must be truncated or greedy"
    v = logits.shape[-1]
    x = _scaled(logits, params)
    greedy = params.greedy
    if bool((params.top_p < 1).any()):
        x = _top_k_mask(x, params.top_k)
        vals, ids = _support(x, _top_p_keep(x, params.top_p))
    else:
        k = torch.where(greedy, 1, params.top_k.clamp(max=v))
        vals, ids = x.topk(int(k.max()), dim=-1)
        vals = vals.masked_fill(torch.arange(vals.shape[1]) >= k.unsqueeze(1), float("-inf"))
        # Canonical order: ascending token id, padding last. An inverse-CDF draw over
        # the support then walks the vocabulary in the same order as a draw over the
        # dense row, so a request's token never depends on its batch's encoding.
        valid = torch.isfinite(vals)
        order = torch.where(valid, ids, v).argsort(dim=-1)
        vals, ids = vals.gather(1, order), torch.where(valid, ids, -1).gather(1, order)
    if bool(greedy.any()):
        vals[greedy] = float("-inf")
        vals[greedy, 0] = 0.0
        ids[greedy] = -1
        ids[greedy, 0] = logits[greedy].argmax(dim=-1)
    return torch.log_softmax(vals, dim=-1), ids


def _scaled(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """fp32 logits [B, ...] / T (greedy rows: T = 1); no pass at all when every T is 1."""
    x = logits.float()
    t = torch.where(params.greedy, 1.0, params.temperature).to(x.device)
    return x if bool((t == 1).all()) else x / t.view(-1, *[1] * (x.ndim - 1))


def _top_k_mask(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    v = x.shape[-1]
    k = torch.where((k <= 0) | (k > v), torch.full_like(k, v), k)
    if bool((k == v).all()):
        return x
    vals, ids = x.topk(int(k.max()), dim=-1)
    keep = torch.arange(vals.shape[1], device=x.device).unsqueeze(0) < k.unsqueeze(1)
    out = torch.full_like(x, float("-inf")).scatter_(1, ids, vals.masked_fill(~keep, float("-inf")))
    return torch.where((k == v).unsqueeze(1), x, out)


def _top_p_keep(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Which entries of x [B, V] (-inf: out already) each row keeps: under top-p (p < 1) the
    tokens at least as likely as the last of the smallest prefix, in descending probability,
    whose mass reaches p (at least the most likely token); every finite one where p = 1.

    Only the probabilities are ranked, not the tokens: the prefix's last value is the
    threshold. On the CPU numpy sorts them (a fraction of ``torch.sort``'s time, which also
    ranks the ids; a drafter round at top-p ranks a row per request and position)."""
    keep = torch.isfinite(x)
    rows = (p < 1).nonzero().squeeze(1)
    if rows.numel():
        probs = torch.softmax(x[rows], dim=-1)
        if probs.is_cpu:
            ranked = torch.from_numpy(np.sort(probs.numpy(), axis=-1)[:, ::-1].copy())
        else:
            ranked = probs.sort(dim=-1, descending=True).values
        before = ranked.cumsum(dim=-1) - ranked  # the mass ahead of each ranked value
        last = ((before < p[rows].unsqueeze(1)).sum(dim=-1) - 1).clamp(min=0)
        keep[rows] &= probs >= ranked.gather(1, last.unsqueeze(1))
    return keep


def _support(x: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of x [B, V] that ``keep`` marks, each row's in ascending id order: (values
    [B, S], ids [B, S]), padded with (-inf, -1) to the widest row's S (at least 1)."""
    width = max(int(keep.sum(dim=-1).max()), 1)
    r, c = keep.nonzero(as_tuple=True)  # row-major: each row's ids ascending
    col = keep.cumsum(dim=-1)[r, c] - 1  # each entry's place in its row
    vals = torch.full((x.shape[0], width), float("-inf"), dtype=x.dtype, device=x.device)
    ids = torch.full((x.shape[0], width), -1, dtype=torch.int64, device=x.device)
    vals[r, col] = x[r, c]
    ids[r, col] = c
    return vals, ids


def sample_from_logp(weights_logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from each row's law, one uniform per row.

    weights_logp: [N, S] fp32/fp64 log-weights (need not be normalized; -inf =
    excluded). u: [N] float64 in (0, 1). Returns [N] int64 column indices.
    The law sampled is exp(w) / sum(exp(w)) computed in float64: exactly the
    values given, renormalized. A zero-weight column is never returned.
    """
    w = weights_logp.double()
    w = torch.exp(w - w.amax(dim=-1, keepdim=True))
    return sample_from_weights(w, u)


_BLOCK = 128  # columns per block of the two-level inverse CDF


def sample_from_weights(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from non-negative weights [N, S] (fp32 or fp64), one uniform per row.

    Two-level inverse CDF: the cumulative (float64) block sums of _BLOCK
    columns locate the block, a float64 cumulative sum inside that block
    locates the column. The
    law is w / sum(w) (up to float64 rounding), as with one flat cumsum, at a
    fraction of its cost. Returns [N] int64 column indices; -1 for a row with
    no mass. A zero-weight column is never returned.
    """
    n, s = w.shape
    nb = -(-s // _BLOCK)
    padded = w if s == nb * _BLOCK else torch.nn.functional.pad(w, (0, nb * _BLOCK - s))
    blocks = padded.view(n, nb, _BLOCK)
    bcdf = blocks.sum(dim=-1).double().cumsum(dim=-1)  # [N, nb]
    total = bcdf[:, -1]
    x = u * total
    # first block whose cumulative mass exceeds x: it has positive mass
    b = torch.searchsorted(bcdf, x.unsqueeze(1), right=True).squeeze(1).clamp_(max=nb - 1)
    before = torch.where(b > 0, bcdf.gather(1, (b - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    inner = blocks[torch.arange(n), b].double()  # [N, BLOCK]
    col = torch.searchsorted(inner.cumsum(dim=-1), (x - before).unsqueeze(1), right=True)
    col = col.squeeze(1)
    # rounding can push the remainder past the block's own cumsum: then take the
    # block's last positive column, never a zero-weight one
    off = col >= _BLOCK
    if bool(off.any()):
        col[off] = _BLOCK - 1 - (inner[off] > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.where(total > 0, b * _BLOCK + col, -1)
