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
computed from integers with exact integer arithmetic (uint64 lanes holding
32-bit words, numpy on the host: a round of noise is a few dozen values, so the
host is faster than a device launch) and converted to float64 exactly.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch

__all__ = ["Stream", "philox4x32", "uniform"]

_M32 = np.uint64(0xFFFFFFFF)
_MULT = np.array([[0xD2511F53], [0xCD9E8D57]], dtype=np.uint64)  # Philox M0, M1
_WEYL = np.array([[0x9E3779B9], [0xBB67AE85]], dtype=np.uint64)  # Philox W0, W1
_SHIFT = np.uint64(32)
_ROUNDS = 10


class Stream(IntEnum):
    """Noise stream ids. Never reuse a retired value: add new streams at the end."""

    DRAFT = 1  # the drafter's draw d ~ q
    ACCEPT = 2  # the verifier's acceptance uniform, accept iff u < p(d) / q(d)
    RECOVER = 3  # the verifier's draw from norm(max(0, p - q)) at the first rejection
    BONUS = 4  # the verifier's draw from p_{K+1} when every draft was accepted


def philox4x32(
    counter: tuple[np.ndarray, ...], key: tuple[np.ndarray, ...]
) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 on uint64 arrays holding 32-bit words (broadcasting).

    The 32x32 -> 64-bit products are exact in uint64, so the high and low words
    are a shift and a mask; the arithmetic is the same on every machine. The
    two lanes of a round, (c0, c2) and (c1, c3), are stacked so that each
    round is a handful of numpy calls whatever the batch.
    """
    *words, k0, k1 = np.broadcast_arrays(*(np.asarray(w, dtype=np.uint64)
                                           for w in (*counter, *key)))
    shape = words[0].shape
    even = np.stack([words[0].ravel(), words[2].ravel()])  # [2, N]: c0, c2
    odd = np.stack([words[1].ravel(), words[3].ravel()])  # [2, N]: c1, c3
    k = np.stack([k0.ravel(), k1.ravel()])  # [2, N]: k0, k1
    for _ in range(_ROUNDS):
        p = even * _MULT  # c0 * M0, c2 * M1
        # c0' = hi(c2 M1) ^ c1 ^ k0, c2' = hi(c0 M0) ^ c3 ^ k1; c1' = lo(c2 M1), c3' = lo(c0 M0)
        even, odd = (p >> _SHIFT)[::-1] ^ odd ^ k, (p & _M32)[::-1]
        k = (k + _WEYL) & _M32
    return tuple(w.reshape(shape) for w in (even[0], odd[0], even[1], odd[1]))


def _u32(name: str, value: torch.Tensor | np.ndarray | int) -> np.ndarray:
    a = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value, dtype=np.int64)
    if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
        raise ValueError(
            f"{name} must lie in [0, 2**32); got range [{int(a.min())}, {int(a.max())}]")
    return a.astype(np.uint64)


def uniform(
    seed: torch.Tensor | int,
    position: torch.Tensor | int,
    stream: Stream | torch.Tensor,
    index: torch.Tensor | int = 0,
) -> torch.Tensor:
    """float64 uniforms in the open interval (0, 1), one per broadcast element.

    seed: int64 (any 64-bit value); position, index: in [0, 2**32); stream: a
    Stream or an int64 tensor of stream ids (broadcast like the others).
    The result has 52 random bits: u = (x + 0.5) / 2**52 with x < 2**52, which
    float64 holds exactly, so 0 < u <= 1 - 2**-53 < 1. It is returned on the
    device of ``seed`` (CPU when ``seed`` is not a tensor).
    """
    device = seed.device if isinstance(seed, torch.Tensor) else torch.device("cpu")
    s = np.asarray(seed.cpu() if isinstance(seed, torch.Tensor) else seed, dtype=np.int64)
    s = s.view(np.uint64)
    pos = _u32("position", position)
    idx = _u32("index", index)
    st = _u32("stream", stream)
    s, pos, idx, st = np.broadcast_arrays(s, pos, idx, st)
    w0, w1, _, _ = philox4x32((idx, pos, st, np.zeros_like(pos)), (s & _M32, s >> _SHIFT))
    bits52 = ((w1 >> np.uint64(12)) << _SHIFT) | w0  # 20 + 32 bits
    u = (bits52.astype(np.float64) + 0.5) * (2.0**-52)
    return torch.from_numpy(np.ascontiguousarray(u)).to(device)
