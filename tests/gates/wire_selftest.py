"""The wire's self-test: a quick, self-contained check that can run inside any image.

It encodes and decodes every frame kind, makes the decoder refuse one broken
frame per main failure class, runs one authenticated loopback round against the
trivial drafter on 127.0.0.1 and checks that a client without the key is refused.
``run()`` returns one ``Check`` per step; the gate test_wire_selftest.py beside it
asserts them all. Test code (it runs from tests/, which the images carry).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

import crc32c
import torch
from wire_loopback import TrivialDrafter, trivial_hello

from specpair.proposal import QKind
from specpair.wire import errors as E
from specpair.wire.client import DraftClient
from specpair.wire.codec import decode, encode
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
    ProposeItem,
    Release,
    RequestParams,
)
from specpair.wire.server import ServerThread

__all__ = ["Check", "run"]

V = 1000
KEY = b"selftest-key-0123456789abcdef"


@dataclass(frozen=True)
class Check:
    """One self-test step."""

    name: str  # what was checked
    ok: bool  # whether it passed
    detail: str  # what happened


def _sparse(rid: int, depth: int = 3, support: int = 4) -> DraftItem:
    ids = torch.stack([torch.arange(support) * 7 + k for k in range(depth)])
    lp = torch.full((depth, support), -math.log(support))
    return DraftItem(rid, ItemStatus.OK, ids[:, 1].clone(), QKind.SPARSE, lp, ids)


def _frames():
    spec = FeatureSpec(FeatureKind.AUX_POOLED, torch.bfloat16, 8)
    sampled = trivial_hello(V, support=4)
    feats = trivial_hello(V, support=4, features=spec)
    greedy = trivial_hello(V, kind=QKind.POINT_MASS)
    dense_lp = torch.full((2, V), -math.log(V))
    propose = Propose(3, (ProposeItem(9, torch.tensor([1, 2, 3]), 1, 10, 4,
                                      RequestParams(0.7, 40, 0.9, -5),
                                      torch.randn(3, 8).to(torch.bfloat16)),))
    return [
        ("HELLO", sampled, None), ("HELLO features", feats, None),
        ("CHALLENGE", Challenge(bytes(range(32))), None),
        ("AUTH", Auth(bytes(32), bytes(range(32))), None), ("AUTH_OK", AuthOk(bytes(32)), None),
        ("PROPOSE", propose, feats),
        ("PROPOSAL sparse+dense+resync", ProposalFrame(4, (
            _sparse(1), DraftItem(2, ItemStatus.OK, torch.tensor([0, 5]), QKind.DENSE,
                                  dense_lp, None),
            DraftItem(3, ItemStatus.RESYNC, torch.zeros(0, dtype=torch.int64), QKind.SPARSE,
                      None, None))), dataclasses.replace(sampled, q_encodings=(
                          QKind.SPARSE, QKind.DENSE))),
        ("PROPOSAL point mass", ProposalFrame(5, (DraftItem(
            1, ItemStatus.OK, torch.tensor([3, 4]), QKind.POINT_MASS, None, None),)), greedy),
        ("RELEASE", Release((1, 2)), None), ("ERROR", ErrorFrame(1, "bad frame"), None),
    ]


def _reseal(b: bytearray) -> bytes:
    struct.pack_into("<I", b, 12, crc32c.crc32c(bytes(b[16:]), crc32c.crc32c(bytes(b[:12]))))
    return bytes(b)


def _attacks():
    hello = trivial_hello(V, support=4)
    good = encode(ProposalFrame(1, (_sparse(1),)))
    toks = 48  # first drafted token: header 16 + body header 16 + item header 16

    def poke(offset: int, fmt: str, value) -> bytes:
        b = bytearray(good)
        struct.pack_into(fmt, b, offset, value)
        return _reseal(b)

    def item(**kw) -> bytes:
        return encode(ProposalFrame(1, (dataclasses.replace(_sparse(1), **kw),)))

    lp = _sparse(1).q_logp
    return hello, [
        ("truncated", good[:-8], E.Truncated), ("bad magic", b"XPWR" + good[4:], E.BadMagic),
        ("wrong version", poke(4, "<H", 2), E.BadVersion),
        ("bad checksum", good[:-1] + bytes([good[-1] ^ 1]), E.BadChecksum),
        ("unknown kind", poke(6, "<B", 99), E.UnknownKind),
        ("oversized", poke(8, "<I", 1 << 30), E.FrameTooLarge),
        ("token id >= vocab", poke(toks, "<i", V), E.TokenOutOfRange),
        ("NaN q", item(q_logp=lp.clone().index_fill_(1, torch.tensor([1]), math.nan)),
         E.NonFiniteQ),
        ("un-normalized q", item(q_logp=lp + 0.5), E.UnnormalizedQ),
        ("q(d) = 0", item(tokens=torch.tensor([1, 1, 1])), E.ZeroDraftQ),
        ("duplicate request", encode(ProposalFrame(1, (_sparse(1), _sparse(1)))),
         E.DuplicateRequest),
    ]


def _check(name: str, fn: Callable[[], str]) -> Check:
    try:
        return Check(name, True, fn())
    except Exception as exc:  # noqa: BLE001 - a self-test reports, it does not crash
        return Check(name, False, f"{type(exc).__name__}: {exc}")


def _roundtrip(frame, hello) -> str:
    data = encode(frame)
    back = decode(data, hello)
    if encode(back) != data:
        raise AssertionError("decoded frame re-encodes differently")
    return f"{len(data)} bytes"


def _refused(data: bytes, hello, cls: type) -> str:
    try:
        decode(data, hello)
    except E.WireError as exc:
        if type(exc) is not cls:
            raise AssertionError(f"expected {cls.__name__}, got {exc!r}") from None
        return f"{cls.__name__}: {exc}"
    raise AssertionError(f"decoded although it should raise {cls.__name__}")


def _loopback() -> list[Check]:
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello)
    with ServerThread(drafter, hello, KEY) as srv:
        item = ProposeItem(1, torch.tensor([4, 5, 6]), 0, 3, 3, RequestParams(1.0, 0, 1.0, 1),
                           None)

        def good() -> str:
            with DraftClient("127.0.0.1", srv.port, KEY, vocab_size=V,
                             tokenizer_fingerprint=hello.tokenizer_fingerprint) as c:
                (d,) = c.propose([item], deadline_s=10.0)
                if not isinstance(d, DraftItem) or d.tokens.shape != (3,):
                    raise AssertionError(f"round answered {d!r} (last error: {c.last_error})")
                return f"drafted {d.tokens.tolist()} on port {srv.port}"

        def refused() -> str:
            with DraftClient("127.0.0.1", srv.port, b"not-the-key-0123456789", vocab_size=V,
                             tokenizer_fingerprint=hello.tokenizer_fingerprint) as c:
                try:
                    c.connect(timeout_s=10.0)
                except E.AuthFailed as exc:
                    return f"refused: {exc}"
                raise AssertionError("a client without the key was served")

        return [_check("loopback round", good), _check("client without the key", refused)]


def run() -> list[Check]:
    """Every self-test step, in order."""
    checks = [_check(f"round trip {name}", lambda f=frame, h=hello: _roundtrip(f, h))
              for name, frame, hello in _frames()]
    hello, attacks = _attacks()
    checks += [_check(f"refuse {name}", lambda d=data, c=cls: _refused(d, hello, c))
               for name, data, cls in attacks]
    return checks + _loopback()
