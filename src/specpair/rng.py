"""Counter-based noise streams.

Every random number specpair uses is a pure function of
``(seed, position, stream, index)``:

    u = uniform(seed, position, stream, index)        # float64 in (0, 1)

computed with Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers:
as easy as 1, 2, 3"): the 64-bit request seed is the Philox KEY and the tuple
is the 128-bit COUNTER, one 32-bit word per field:

    counter = (index, position, stream, 0)      key = (seed_lo32, seed_hi32)

Why the streams are disjoint by construction: for a fixed key Philox is a
bijection on counters, and the stream id occupies its own counter word. Two
draws from different streams therefore have different counters and can never
be the same Philox block, whatever their positions or indices (contrast with
salting a position by adding an offset, e.g. ``pos + 2**30``, which aliases
once positions reach the offset). ``position`` and ``index`` are checked to
fit in 32 bits so no field can spill into its neighbour.

Nothing here depends on batch composition, call order or device: the value is
computed from integers with exact integer arithmetic (int64 lanes holding
32-bit words) and converted to float64 exactly, so CPU and CUDA agree bit for
bit.
"""

from __future__ import annotations

from enum import IntEnum

import torch

__all__ = ["Stream", "philox4x32", "uniform"]

_M32 = 0xFFFFFFFF
_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_ROUNDS = 10


class Stream(IntEnum):
    """Noise stream ids. Never reuse a retired value: add new streams at the end."""

    DRAFT = 1  # the drafter's draw d ~ q
    ACCEPT = 2  # the verifier's acceptance uniform, accept iff u < p(d) / q(d)
    RECOVER = 3  # the verifier's draw from norm(max(0, p - q)) at the first rejection
    BONUS = 4  # the verifier's draw from p_{K+1} when every draft was accepted


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # a, b < 2**32, so the product fits in 64 bits; int64 wraps modulo 2**64 and
    # masking after the (arithmetic) shift recovers the unsigned high word.
    prod = b * a
    return (prod >> 32) & _M32, prod & _M32


def philox4x32(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding 32-bit words (broadcasting)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(_ROUNDS):
        hi0, lo0 = _mulhilo(_PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(_PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _PHILOX_W0) & _M32
        k1 = (k1 + _PHILOX_W1) & _M32
    return c0, c1, c2, c3


def uniform(
    seed: torch.Tensor,
    position: torch.Tensor,
    stream: Stream,
    index: torch.Tensor | int = 0,
) -> torch.Tensor:
    """float64 uniforms in the open interval (0, 1), one per broadcast element.

    seed: int64 (any 64-bit value); position, index: int64 in [0, 2**32).
    The result has 52 random bits: u = (x + 0.5) / 2**52 with x < 2**52, which
    float64 holds exactly, so 0 < u <= 1 - 2**-53 < 1.
    """
    seed = torch.as_tensor(seed, dtype=torch.int64)
    position = torch.as_tensor(position, dtype=torch.int64, device=seed.device)
    index = torch.as_tensor(index, dtype=torch.int64, device=seed.device)
    for name, t in (("position", position), ("index", index)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) > _M32):
            raise ValueError(f"{name} must lie in [0, 2**32); got range "
                             f"[{int(t.min())}, {int(t.max())}]")
    seed, position, index = torch.broadcast_tensors(seed, position, index)
    key = (seed & _M32, (seed >> 32) & _M32)
    zero = torch.zeros_like(position)
    w0, w1, _, _ = philox4x32((index, position, zero + int(stream), zero), key)
    bits52 = ((w1 >> 12) << 32) | w0  # 20 + 32 bits
    return (bits52.to(torch.float64) + 0.5) * (2.0**-52)
