"""The target-side client: what the vLLM overlay calls once per decode round.

    client = DraftClient(host, port, key, vocab_size=V, tokenizer_fingerprint=fp)
    drafts = client.propose(items, deadline_s=0.004)   # per request: DraftItem or MISSING
    proposal = to_proposal(drafts, depth=K, vocab_size=V)  # present=False where MISSING

Fail-safe rules: an answer that is late, dropped, malformed, for another round,
with a wrong depth, RESYNC or REFUSED is MISSING, never point mass. POINT_MASS
only passes when the drafter's HELLO declared GREEDY (the decoder refuses it
otherwise). ``propose`` never blocks past its deadline: when disconnected it
tries one reconnect only when the backoff allows, bounded by the same deadline.

The client keeps every live request's committed history (and its context
features when the HELLO asks for them). After a RESYNC, an answer that did not
match, or any new connection (the drafter may have restarted), it sends that
request's whole history, with ``position == len(new_tokens)``, which tells the
drafter to rebuild its state from scratch (docs/wire.md 3.3).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from enum import Enum

import torch

from specpair.draft import DraftMode
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
    ItemStatus,
    ProposalFrame,
    Propose,
    ProposeItem,
    Release,
)
from specpair.wire.history import History

__all__ = ["MISSING", "Missing", "MissingReason", "DraftClient"]

log = logging.getLogger("specpair.wire.client")


class Missing:
    """The sentinel type of a request whose proposal is missing (use ``MISSING``)."""

    _instance: Missing | None = None

    def __new__(cls) -> Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING = Missing()


class MissingReason(Enum):
    """Why a request's proposal was MISSING (``DraftClient.missing`` counts these)."""

    DISCONNECTED = "disconnected"  # no connection (drafter down, or reconnect backing off)
    LATE = "late"  # the answer did not arrive before the deadline
    INVALID = "invalid"  # the answer frame failed to decode (connection dropped)
    PEER_ERROR = "peer_error"  # the drafter sent ERROR (connection dropped)
    MISMATCH = "mismatch"  # no item for the request, or a depth other than asked
    RESYNC = "resync"  # the drafter asked for the whole history
    REFUSED = "refused"  # the drafter refused the request


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
        self.missing: Counter[MissingReason] = Counter()  # MISSING requests by reason
        self.late_answers = 0  # answers discarded because their round had ended
        self.connects = 0  # successful connections (the first included)
        self.last_error: str | None = None  # the latest connection or frame failure
        self._conn: Connection | None = None
        self._round = 0
        self._next_attempt = 0.0
        self._backoff = backoff_initial_s
        self._history = History()

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
        self._history.mark_all_stale()  # a new connection may be a restarted drafter
        return self._conn.hello

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
        """One round: per item of ``batch`` (in order) a verified DraftItem or MISSING.

        ``batch`` items carry only the tokens committed since the request's previous
        round (the whole prompt on its first), as docs/wire.md 3.3 says; the client
        substitutes whole histories where a resend is due. ``deadline_s`` is the
        budget in seconds from now; the call returns by then whatever happens.
        """
        deadline = time.monotonic() + deadline_s
        ids = [it.request_id for it in batch]
        if len(set(ids)) != len(ids):
            raise DuplicateRequest("propose() got the same request twice")
        for it in batch:  # all checks before any change: nothing half-applied
            self._check_item(it)
        for it in batch:
            self._history.commit(it)
        if not batch:
            return []
        if not self._ensure(deadline):
            return self._all_missing(batch, MissingReason.DISCONNECTED)
        out: dict[int, DraftItem | Missing] = {}
        send = []
        for it in batch:  # deeper than the drafter serves: it would refuse the whole frame
            if it.depth > self._conn.hello.max_depth:
                self._history.mark_stale(it.request_id)
                self.missing[MissingReason.REFUSED] += 1
                out[it.request_id] = MISSING
            else:
                send.append(it)
        if send:
            out.update(zip((it.request_id for it in send), self._round_trip(send, deadline),
                           strict=True))
        return [out[rid] for rid in ids]

    def _round_trip(self, batch: list[ProposeItem],
                    deadline: float) -> list[DraftItem | Missing]:
        self._round += 1
        frame = Propose(self._round, tuple(self._wire_item(it) for it in batch))
        data = encode(frame, self.limits)  # checked in _check_item: does not raise
        try:
            self._conn.send(data, deadline)
        except WireError as exc:  # a partial send leaves the stream unusable
            self._drop(f"send: {exc}")
            late = isinstance(exc, DeadlineExceeded)
            return self._all_missing(batch, MissingReason.LATE if late
                                     else MissingReason.DISCONNECTED)
        self._history.sent(it.request_id for it in batch)
        answer = self._await(frame.round_id, deadline, batch)
        if isinstance(answer, MissingReason):
            return self._all_missing(batch, answer)
        return self._match(batch, answer)

    def _check_item(self, it: ProposeItem) -> None:
        """Everything the encoder or the drafter's decoder would refuse is the caller's bug:
        raise here, before anything changes, rather than lose the connection later."""
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
        self._history.check(it)
        spec = self.features
        f = it.features
        if (spec is None) != (f is None) or (f is not None and (
                f.dtype != spec.dtype or f.ndim != 2 or f.shape[1] != spec.width)):
            raise FeatureMismatch(f"request {it.request_id}: features must be "
                                  f"{'absent' if spec is None else spec} as this client declared")

    def _wire_item(self, it: ProposeItem) -> ProposeItem:
        if not self._history.stale(it.request_id):
            return it
        tokens, feats = self._history.whole(it.request_id)
        return replace(it, new_tokens=tokens, num_accepted=0, features=feats)

    def _await(self, round_id: int, deadline: float, batch) -> ProposalFrame | MissingReason:
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

    def _match(self, batch, answer: ProposalFrame) -> list[DraftItem | Missing]:
        by_id = {d.request_id: d for d in answer.items}
        out: list[DraftItem | Missing] = []
        for it in batch:
            d = by_id.get(it.request_id)
            if d is None or (d.status == ItemStatus.OK and d.tokens.shape[0] != it.depth):
                reason = MissingReason.MISMATCH
            elif d.status == ItemStatus.RESYNC:
                reason = MissingReason.RESYNC
            elif d.status == ItemStatus.REFUSED:
                reason = MissingReason.REFUSED
            elif d.kind == QKind.POINT_MASS and self.hello.mode != DraftMode.GREEDY:
                reason = MissingReason.INVALID  # unreachable past the decoder; kept as a guard
            else:
                out.append(d)
                continue
            if reason in (MissingReason.MISMATCH, MissingReason.RESYNC):
                self._history.mark_stale(it.request_id)
            self.missing[reason] += 1
            out.append(MISSING)
        return out

    def _all_missing(self, batch, reason: MissingReason) -> list[Missing]:
        self.missing[reason] += len(batch)
        return [MISSING] * len(batch)

    def release(self, request_ids: Sequence[int], timeout_s: float = 0.05) -> None:
        """Forget finished requests and tell the drafter (best effort, bounded)."""
        ids = tuple(dict.fromkeys(request_ids))
        self._history.forget(ids)
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


