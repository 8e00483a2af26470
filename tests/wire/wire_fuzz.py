"""Mutation fuzz of the wire decoder: valid frames, mutated, must decode or raise a WireError.

    .venv/bin/python tests/wire/wire_fuzz.py --iterations 2000000 [--seed N] [--reseal always]
    # `make fuzz`

Mutations: bit flips, interesting bytes, interesting u16/u32/u64 and f32 values
written over fields, f32 values moved by a few ulps, truncation, extension, deleted
and duplicated ranges. The corpus holds valid frames of every kind, SPARSE rows
among them whose mass sits as close inside 1 +- 1e-3 as an ulp of one entry
allows (where an ulp decides the verdict).

Resealing, ``mostly`` (the default): 80 % of the mutants get their CRC (and half of
those body_len) repaired, so most reach the body's checks and the rest exercise the
header and the checksum. ``always``: every mutant gets its CRC recomputed and, where
its length changed, zero bytes to a multiple of 8 and body_len repaired, so all but
those whose header fields were hit reach the body's checks.

Any exception that is not a WireError fails, and so does a decoded mutant that does
not re-encode to the same bytes (one encoding per frame). A watchdog ends the process
on a hang.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import random
import struct
import sys
import time
import warnings
from dataclasses import dataclass, field

import crc32c
import numpy as np
import torch
from wire_helpers import (
    dense_item,
    make_hello,
    point_item,
    propose_item,
    sparse_item,
    status_item,
)

from specpair.proposal import QKind
from specpair.wire.codec import decode, encode
from specpair.wire.codec.header import HEADER, NORM_TOLERANCE
from specpair.wire.errors import WireError
from specpair.wire.frames import (
    Auth,
    AuthOk,
    Challenge,
    DraftItem,
    ErrorFrame,
    FeatureKind,
    FeatureSpec,
    ItemStatus,
    ProposalFrame,
    Propose,
    Release,
)

V = 1000
INTS = [0, 1, 2, 7, 8, 255, 256, V - 1, V, V + 1, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
        0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
FLOATS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 1e30, -1e30, 1e-45]


def corpus() -> list[tuple[bytes, object]]:
    """(valid frame bytes, the HELLO to decode it with)."""
    rng = np.random.default_rng(0)
    sampled = make_hello(V, max_depth=6, max_support=16)
    feats = make_hello(V, kinds=(QKind.SPARSE,), max_depth=6, max_support=16,
                       features=FeatureSpec(FeatureKind.AUX_POOLED, torch.bfloat16, 4))
    greedy = make_hello(V, kinds=(QKind.POINT_MASS,), max_depth=6)
    out: list[tuple[bytes, object]] = []
    for i in range(8):
        items = [sparse_item(rng, 10 * i + j, V, 1 + (i + j) % 5, 1 + (3 * i + j) % 16)
                 for j in range(1 + i % 3)]
        if i % 2:
            items.append(dense_item(rng, 99, V, 1 + i % 3))
        if i % 3 == 0:
            items.append(status_item(98, ItemStatus.RESYNC))
        out.append((encode(ProposalFrame(i, tuple(items))), sampled))
        out.append((encode(ProposalFrame(i, (point_item(rng, 1, V, 1 + i % 6),))), greedy))
        out.append((encode(Propose(i, tuple(propose_item(rng, j, feats, n_new=1 + (i + j) % 7)
                                            for j in range(1 + i % 3)))), feats))
        out.append((encode(Propose(i, (propose_item(rng, 5, sampled, n_new=1 + i),))), sampled))
    for i in range(4):  # SPARSE rows at the normalization edges
        out.append((encode(ProposalFrame(i, (_edge_item(rng, i, upper=i % 2 == 0),))),
                    sampled))
    out += [(encode(h), None) for h in (sampled, feats, greedy)]
    out += [(encode(Release((1, 2, 3 << 40))), None), (encode(ErrorFrame(3, "bad frame é")), None),
            (encode(Challenge(bytes(range(32)))), None),
            (encode(Auth(bytes(32), bytes(range(32)))), None), (encode(AuthOk(bytes(32))), None)]
    return out


def _mass(row: np.ndarray) -> float:
    """The decoder's SPARSE mass: float64 exp summed in slot order."""
    m = 0.0
    for x in row.tolist():
        m += math.exp(x)
    return m


def _edge_item(rng: np.random.Generator, rid: int, upper: bool) -> DraftItem:
    """A valid SPARSE item, K = 2, S = 8, each row's mass as close to 1 +- 1e-3 (the
    upper or the lower edge) as moving its last log q by ulps gets it, still inside."""
    edge = 1 + NORM_TOLERANCE if upper else 1 - NORM_TOLERANCE
    inward, outward = (np.float32(-np.inf), np.float32(np.inf))[::1 if upper else -1]
    ids = np.stack([rng.choice(V, 8, replace=False) for _ in range(2)]).astype(np.int64)
    lp = np.empty((2, 8), np.float32)
    for row, q in zip(lp, rng.random((2, 8)) + 0.1, strict=True):
        row[:] = np.log(q / q.sum() * edge)
        while abs(_mass(row) - 1) > NORM_TOLERANCE:
            row[-1] = np.nextafter(row[-1], inward)
        nxt = row.copy()
        nxt[-1] = np.nextafter(row[-1], outward)
        while abs(_mass(nxt) - 1) <= NORM_TOLERANCE:
            row[-1] = nxt[-1]
            nxt[-1] = np.nextafter(row[-1], outward)
    return DraftItem(rid, ItemStatus.OK, torch.from_numpy(ids[:, 0].copy()), QKind.SPARSE,
                     torch.from_numpy(lp), torch.from_numpy(ids))


def _seal(b: bytearray) -> None:
    """Recompute the CRC-32C of header[0:12] + body in place."""
    struct.pack_into("<I", b, 12, crc32c.crc32c(bytes(b[HEADER.size:]),
                                                 crc32c.crc32c(bytes(b[:12]))))


def mutate(r: random.Random, data: bytes, reseal: str = "mostly") -> bytes:
    b = bytearray(data)
    for _ in range(r.choice((1, 1, 1, 2, 3))):
        op = r.randrange(9)
        n = len(b)
        if op == 0 and n:
            i = r.randrange(n)
            b[i] ^= 1 << r.randrange(8)
        elif op == 1 and n:
            b[r.randrange(n)] = r.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif op in (2, 3) and n >= 8:
            size, fmt = r.choice(((2, "<H"), (4, "<I"), (8, "<Q")))
            i = r.randrange(0, n - size + 1) & ~(size - 1)
            struct.pack_into(fmt, b, i, r.choice(INTS) & ((1 << (8 * size)) - 1))
        elif op == 4 and n >= 4:
            i = r.randrange(0, n - 3) & ~3
            struct.pack_into("<f", b, i, r.choice(FLOATS))
        elif op == 5:
            del b[r.randrange(n + 1):]
        elif op == 6:
            b += bytes(r.randrange(256) for _ in range(r.choice((1, 4, 8, 16))))
        elif op == 7 and n > 17:
            i, j = sorted(r.sample(range(16, n), 2))
            b[i:j] = b[i:j] * r.choice((0, 2))
        elif op == 8 and n >= 4:  # an f32 moved by a few ulps (its bits as an integer)
            i = r.randrange(0, n - 3) & ~3
            (bits,) = struct.unpack_from("<I", b, i)
            struct.pack_into("<I", b, i, (bits + r.choice((-3, -2, -1, 1, 2, 3))) & 0xFFFFFFFF)
    if len(b) >= HEADER.size and reseal == "always":
        if len(b) != len(data):  # a well-formed envelope: 8-aligned, body_len its length
            b += bytes(-(len(b) - HEADER.size) % 8)
            struct.pack_into("<I", b, 8, len(b) - HEADER.size)
        _seal(b)
    elif len(b) >= HEADER.size and r.random() < 0.8:
        if r.random() < 0.5:
            struct.pack_into("<I", b, 8, len(b) - HEADER.size)
        _seal(b)
    return bytes(b)


@dataclass
class Outcome:
    iterations: int = 0
    decoded: int = 0  # mutants that were still valid frames
    refused: dict[str, int] = field(default_factory=dict)  # WireError class -> count
    failures: list[str] = field(default_factory=list)  # anything else
    slowest_s: float = 0.0


def run(iterations: int, seed: int = 0, watchdog_s: float = 600.0,
        reseal: str = "mostly") -> Outcome:
    frames = corpus()
    r = random.Random(seed)
    out = Outcome()
    faulthandler.dump_traceback_later(watchdog_s, exit=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a numpy/torch warning is a failure too
            for i in range(iterations):
                data, hello = frames[r.randrange(len(frames))]
                mutant = mutate(r, data, reseal)
                authed = r.random() < 0.9
                t0 = time.perf_counter()
                try:
                    frame = decode(mutant, hello, authenticated=authed)
                    if encode(frame) != mutant:
                        out.failures.append(f"iteration {i}: decoded mutant re-encodes differently")
                    out.decoded += 1
                except WireError as exc:
                    name = type(exc).__name__
                    out.refused[name] = out.refused.get(name, 0) + 1
                except Exception as exc:  # noqa: BLE001 - the fuzz's whole point
                    out.failures.append(f"iteration {i} (seed {seed}): {exc!r}")
                out.slowest_s = max(out.slowest_s, time.perf_counter() - t0)
                out.iterations += 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2_000_000, help="mutants to decode")
    ap.add_argument("--seed", type=int, default=int(time.time()), help="PRNG seed (printed)")
    ap.add_argument("--reseal", choices=("mostly", "always"), default="mostly",
                    help="repair the CRC of 80 %% of the mutants, or of every one")
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = run(args.iterations, args.seed, watchdog_s=max(600.0, args.iterations / 1000),
              reseal=args.reseal)
    dt = time.perf_counter() - t0
    print(f"seed {args.seed}, reseal {args.reseal}: {out.iterations} mutants in {dt:.1f} s, "
          f"{out.decoded} still valid, slowest decode {out.slowest_s * 1e3:.2f} ms")
    for name, n in sorted(out.refused.items(), key=lambda kv: -kv[1]):
        print(f"  {name:22s} {n}")
    for f in out.failures[:20]:
        print("FAIL", f)
    return 1 if out.failures else 0


if __name__ == "__main__":
    sys.exit(main())
