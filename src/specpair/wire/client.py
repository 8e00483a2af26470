"""The probability wire's target-side transport: one drafter over one TCP connection.

    client = DraftClient(host, port, key, vocab_size=V, tokenizer_fingerprint=fp)
    answers = client.propose(items, deadline_s=0.004)  # per item: DraftItem or Missing(reason)

``DraftClient`` is a ``specpair.wire.source.DraftSource``: it owns the connection
(handshake, HELLO check, reconnect with exponential backoff), round ids, frame
matching and the answers that arrive after their round ended (skipped). It sends
each item as given: what the drafter already holds of a request, and when a whole
history is due, is the session's business (``specpair.wire.session``).

Fail-safe rules: an answer that is late, dropped, malformed, for another round,
with a wrong depth, RESYNC or REFUSED is a ``Missing`` carrying its reason, never
point mass. POINT_MASS only passes when the drafter's HELLO declared GREEDY (the
decoder refuses it otherwise). An item deeper than the HELLO's max_depth is
Missing(REFUSED) locally and never sent (the drafter would refuse the whole frame).
``propose`` never blocks past its deadline: when disconnected it tries one
reconnect only when the backoff allows, bounded by the same deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from specpair.proposal import QKind
from specpair.wire.codec import encode
from specpair.wire.codec.header import LIMITS, Limits, check_u64
from specpair.wire.codec.propose import check_counts, check_params
from specpair.wire.conn import Connection
from specpair.wire.errors import (
    AuthFailed,
    BadShape,
    ConnectionLost,
    DeadlineExceeded,
    DuplicateRequest,
    FeatureMismatch,
    HelloMismatch,
    PeerError,
    TokenOutOfRange,
    WireError,
)
from specpair.wire.frames import (
    DraftItem,
    FeatureSpec,
    Hello,
    ProposalFrame,
    Propose,
    ProposeItem,
    Release,
)
from specpair.wire.source import Missing, MissingReason, answers

__all__ = ["DraftClient"]

log = logging.getLogger("specpair.wire.client")


class DraftClient:
    """A fail-safe, self-reconnecting client of one drafter (one caller thread at a time)."""

    def __init__(self, host: str, port: int, key: bytes, *, vocab_size: int,
                 tokenizer_fingerprint: bytes, features: FeatureSpec | None = None,
                 accept_greedy: bool = True,
                 accept: Sequence[QKind] = (QKind.SPARSE, QKind.DENSE),
                 connect_timeout_s: float = 1.0, backoff_initial_s: float = 0.05,
                 backoff_max_s: float = 2.0, limits: Limits = LIMITS) -> None:
        self.host, self.port, self.key = host, port, key
        self.vocab_size = vocab_size
        self.fingerprint = tokenizer_fingerprint
        self.features = features  # the context features this target sends (None: none)
        self.accept = frozenset(accept) | ({QKind.POINT_MASS} if accept_greedy else frozenset())
        self.connect_timeout_s = connect_timeout_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.limits = limits
        self.late_answers = 0  # answers skipped because their round had ended
        self.connects = 0  # successful connections (the first included): the epoch
        self.last_error: str | None = None  # the latest connection or frame failure
        self._conn: Connection | None = None
        self._round = 0
        self._next_attempt = 0.0
        self._backoff = backoff_initial_s

    # ---- connection ---------------------------------------------------------------------

    @property
    def hello(self) -> Hello | None:
        """The connected drafter's HELLO (None while disconnected)."""
        return None if self._conn is None else self._conn.hello

    def _check_hello(self, h: Hello) -> None:
        if h.vocab_size != self.vocab_size:
            raise HelloMismatch(f"drafter vocab_size {h.vocab_size} != target {self.vocab_size}")
        if h.tokenizer_fingerprint != self.fingerprint:
            raise HelloMismatch("drafter tokenizer fingerprint differs from the target's")
        if h.features != self.features:
            raise HelloMismatch(f"drafter asks for features {h.features}; this target "
                                f"sends {self.features}")
        bad = set(h.q_encodings) - self.accept
        if bad:
            raise HelloMismatch(f"drafter declares q encodings {sorted(k.name for k in bad)} "
                                "this target does not accept")

    def connect(self, timeout_s: float | None = None) -> Hello:
        """Connect now (raises on failure: AuthFailed, HelloMismatch, ConnectionLost, ...)."""
        self.close()
        deadline = time.monotonic() + (self.connect_timeout_s if timeout_s is None else timeout_s)
        self._conn = Connection.open(self.host, self.port, self.key, deadline,
                                     check_hello=self._check_hello, limits=self.limits)
        self.connects += 1
        self._backoff = self.backoff_initial_s
        return self._conn.hello

    def ensure_connected(self, timeout_s: float) -> int | None:
        """The epoch (``connects``) of the connection, opened now if the backoff allows and
        it succeeds within ``timeout_s``; None while disconnected. Never raises."""
        return self.connects if self._ensure(time.monotonic() + timeout_s) else None

    def _ensure(self, deadline: float) -> bool:
        if self._conn is not None:
            return True
        now = time.monotonic()
        if now < self._next_attempt:
            return False
        try:
            self.connect(min(self.connect_timeout_s, deadline - now))
            return True
        except (WireError, ValueError) as exc:
            self.last_error = f"connect: {exc}"
            log.warning("drafter connection failed: %s", exc)
            self._next_attempt = time.monotonic() + self._backoff
            self._backoff = min(2 * self._backoff, self.backoff_max_s)
            return False

    def _drop(self, why: str) -> None:
        self.last_error = why
        log.warning("dropping the drafter connection: %s", why)
        self.close()

    def close(self) -> None:
        """Close the connection (the next propose reconnects, honouring the backoff)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- rounds -------------------------------------------------------------------------

    def propose(self, batch: Sequence[ProposeItem],
                deadline_s: float) -> list[DraftItem | Missing]:
        """One round: per item of ``batch`` (in order) a verified DraftItem or a Missing.

        Items are sent as given (docs/wire.md 3.3: ``position == len(new_tokens)`` is a
        whole history). ``deadline_s`` is the budget in seconds from now; the call
        returns by then whatever happens. An item the encoder or the drafter's decoder
        would refuse is the caller's bug: it raises before anything is sent.
        """
        deadline = time.monotonic() + deadline_s
        ids = [it.request_id for it in batch]
        if len(set(ids)) != len(ids):
            raise DuplicateRequest("propose() got the same request twice")
        for it in batch:
            self._check_item(it)
        if not batch:
            return []
        if not self._ensure(deadline):
            return [Missing(MissingReason.DISCONNECTED)] * len(batch)
        out: dict[int, DraftItem | Missing] = {}
        send = []
        for it in batch:  # deeper than the drafter serves: it would refuse the whole frame
            if it.depth > self._conn.hello.max_depth:
                out[it.request_id] = Missing(MissingReason.REFUSED)
            else:
                send.append(it)
        if send:
            out.update(zip((it.request_id for it in send), self._round_trip(send, deadline),
                           strict=True))
        return [out[rid] for rid in ids]

    def _round_trip(self, batch: list[ProposeItem],
                    deadline: float) -> list[DraftItem | Missing]:
        self._round += 1
        frame = Propose(self._round, tuple(batch))
        data = encode(frame, self.limits)  # checked in _check_item: does not raise
        try:
            self._conn.send(data, deadline)
        except WireError as exc:  # a partial send leaves the stream unusable
            self._drop(f"send: {exc}")
            late = isinstance(exc, DeadlineExceeded)
            return [Missing(MissingReason.LATE if late
                            else MissingReason.DISCONNECTED)] * len(batch)
        answer = self._await(frame.round_id, deadline)
        if isinstance(answer, MissingReason):
            return [Missing(answer)] * len(batch)
        return answers(batch, answer.items, self._conn.hello)

    def _check_item(self, it: ProposeItem) -> None:
        """Raise for what the encoder or the drafter's decoder would refuse."""
        rid = it.request_id
        check_u64(rid, "request_id")
        if it.new_tokens.dtype != torch.int64 or it.new_tokens.ndim != 1:
            raise BadShape(f"request {rid}: new_tokens must be [n] int64")
        check_counts(rid, it.new_tokens.shape[0], it.position, it.depth, it.num_accepted,
                     self.limits, self.limits.depth)
        check_params(rid, it.params)
        toks = it.new_tokens.tolist()
        if min(toks) < 0 or max(toks) >= self.vocab_size or it.num_accepted < 0:
            raise TokenOutOfRange(f"request {rid}: new tokens must lie in [0, "
                                  f"{self.vocab_size}) and num_accepted be >= 0")
        spec = self.features
        f = it.features
        if (spec is None) != (f is None) or (f is not None and (
                f.dtype != spec.dtype or f.ndim != 2 or f.shape[1] != spec.width)):
            raise FeatureMismatch(f"request {it.request_id}: features must be "
                                  f"{'absent' if spec is None else spec} as this client declared")
        if f is not None and f.shape[0] != it.new_tokens.shape[0]:
            raise BadShape(f"request {rid}: {f.shape[0]} feature rows for "
                           f"{it.new_tokens.shape[0]} new tokens")

    def _await(self, round_id: int, deadline: float) -> ProposalFrame | MissingReason:
        while True:
            try:
                frame = self._conn.read(deadline)
            except DeadlineExceeded:
                return MissingReason.LATE  # the connection stays; the answer is skipped later
            except (PeerError, AuthFailed) as exc:
                self._drop(f"peer: {exc}")
                return MissingReason.PEER_ERROR
            except ConnectionLost as exc:
                self._drop(f"read: {exc}")
                return MissingReason.DISCONNECTED
            except WireError as exc:  # the answer failed to decode: the stream is suspect
                self._drop(f"read: {exc}")
                return MissingReason.INVALID
            if not isinstance(frame, ProposalFrame):
                self._drop(f"unexpected {type(frame).__name__} from the drafter")
                return MissingReason.INVALID
            if frame.round_id == round_id:
                return frame
            if frame.round_id < round_id:
                self.late_answers += 1
                continue
            self._drop(f"answer for round {frame.round_id} before round {round_id} was sent")
            return MissingReason.INVALID

    def release(self, request_ids: Sequence[int], timeout_s: float = 0.05) -> None:
        """Tell the drafter these requests finished (best effort, bounded)."""
        ids = tuple(dict.fromkeys(request_ids))
        if not ids or self._conn is None:
            return
        try:
            self._conn.send(encode(Release(ids), self.limits), time.monotonic() + timeout_s)
        except WireError as exc:
            self._drop(f"release: {exc}")

    def __enter__(self) -> DraftClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
