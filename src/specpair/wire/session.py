"""The target-side drafting session: the one owner of what the drafter holds of each request.

One ``DraftSession`` per vLLM engine sits between the overlay's adapters
(``specpair.vllm.v1`` / ``v2``) and a ``DraftSource`` (the TCP ``DraftClient`` or the
in-process engine). Per vLLM request it owns the wire request id, how much of the
committed history the drafter holds, the context features sent so far, and why a
round had no drafts. One decode step is three calls:

    session.begin(live_req_ids)              # release finished requests; connect
    start = session.needed_from(req_id, n)   # per request: the first token it needs
    drafts = session.step([StepRequest(req_id, n, tokens[start:n], ...), ...])

``needed_from`` lets an adapter copy only the tokens committed since the drafter's
copy ends (0: the whole history is due; n: nothing, the request is not asked). Each
request's answer is its ``specpair.qlaw.Drafts`` (the drafts and their exact q) or
None: no drafts, the next step is target-only and exact. q is never guessed.

What the session does with each outcome (docs/wire.md 3.3):

- OK: the drafter holds the history up to n; the next step sends the new tokens
  and how many of these drafts the target accepted.
- RESYNC: the next step sends the whole history under the same wire id.
- REFUSED: the request is not asked again until it finishes. The session refuses a
  request itself, before it is ever sent, when its params lie outside the sampling domain
  (``specpair.sampling.check_params_domain``, docs/core.md): counted as a drafter's
  REFUSED, alone; the other requests of the step are asked as usual.
- any other Missing (late, dropped, invalid, drafter gone, error): the drafter's
  copy is released and the request starts over, whole, under a new wire id.
- a new connection epoch (reconnect, perhaps a restarted drafter): every request's
  next round carries its whole history, the very first round after it included.
- preemption (a history shorter than the drafter's copy): start over as for Missing.
- a request no longer live: released.

Metrics: ``counters`` are cumulative and ``last_round_s`` is the latest round's time; the
target's Prometheus export (``specpair.vllm.metrics``) reads both after every step.
Acceptance comes from the verifier: a request's ``num_sampled`` at a step is 1 + the
drafts the target accepted of those the session handed it the step before, so every
step first counts, per draft position and drafting mode, the drafts accepted last step.

Greedy drafts: where the source is a SAMPLED drafter whose HELLO declared POINT_MASS
(``greedy_items``), a request may ask for argmax drafts (``StepRequest.greedy``, the
PROPOSE item's ``draft_mode``); its answer is then POINT_MASS, and POINT_MASS for a request
that did not ask is invalid (``specpair.wire.source.answers``): a sampled draft verified as a
point mass would bias the output.

Features: when the source declares context features, the session keeps every
request's committed feature rows (vLLM keeps no old hidden states), so a whole
resend carries real rows; positions the adapter never had rows for are zeros.

Exceptions at the seam are never swallowed silently. The wire's documented
failures (``WireError``, and ``OSError`` where a transport raises one) are a
Missing (INVALID / DISCONNECTED), logged at WARNING. Anything else a source raises,
or an answer that breaks the ``DraftSource`` contract, is a bug: it is logged with
its traceback at ERROR and counted in ``counters.errors``, and that step is still
target-only: a drafter-side failure must never kill the target, and the error
counter and the log make the bug visible instead of a silent loss of speed.
A malformed ``StepRequest`` is the adapter's bug and raises ``ValueError`` before
anything changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from specpair.draft import DraftMode
from specpair.errors import BadSamplingParams
from specpair.proposal import QKind
from specpair.qlaw import Drafts
from specpair.sampling import check_params_domain
from specpair.wire.errors import WireError
from specpair.wire.frames import DraftItem, FeatureSpec, ItemStatus, ProposeItem, RequestParams
from specpair.wire.source import DraftSource, Missing, MissingReason

__all__ = ["StepRequest", "Counters", "DraftSession", "draft_mode"]

log = logging.getLogger("specpair.wire.session")

T = TypeVar("T")

# Answers after which the source holds no connection (docs/wire.md 3.3; wire/client.py drops
# it on INVALID and PEER_ERROR): the connected state is False until a reconnect.
_LINK_LOST = frozenset({"disconnected", "invalid", "peer_error"})


def draft_mode(d: Drafts) -> str:
    """The drafting mode of ``d`` as the metrics label it: "greedy" for point-mass q (only a
    drafter that declared greedy drafts sends it), "sampled" for drafts drawn from q."""
    return "greedy" if d.kind == QKind.POINT_MASS else "sampled"


@dataclass(frozen=True)
class StepRequest:
    """One running request at a decode step, as an adapter hands it to the session."""

    req_id: str  # vLLM's request id
    length: int  # n: committed tokens (prompt + accepted output)
    new_tokens: torch.Tensor  # [n - needed_from(req_id, n)] int64 committed tokens from there on
    num_sampled: int  # tokens the target committed this step (1 + accepted drafts)
    depth: int  # K wanted (0 = do not draft this step; new_tokens is then not read)
    params: RequestParams  # temperature (0 = greedy), top_k (0 off), top_p, seed
    # [m, width] target states that predicted the LAST m committed tokens (m <= n), when
    # the source declares features; positions without a row are sent as zeros
    features: torch.Tensor | None = None
    greedy: bool = False  # argmax drafts (POINT_MASS q) wanted; only when ``greedy_items``


@dataclass
class Counters:
    """What one session saw (cumulative; read by tests, metrics and the e2e probe). Frames
    the transport skipped for arriving after their round are its own count
    (``DraftClient.late_answers``); their requests are here, as missing "late"."""

    rounds: int = 0  # steps that asked for drafts
    items: int = 0  # request items asked
    drafted: int = 0  # items answered with drafts
    draft_tokens: int = 0  # draft tokens handed to vLLM
    missing: int = 0  # items without drafts that start over (late, dropped, drafter gone, ...)
    missing_by_reason: dict[str, int] = field(default_factory=dict)  # those by MissingReason value
    resync: int = 0  # items answered RESYNC (resent whole next step)
    refused: int = 0  # items REFUSED (not asked again): by the source, or here for params
    # outside the sampling domain (never sent)
    errors: int = 0  # unexpected exceptions at the seam (bugs; logged with their traceback)
    # drafting mode -> per draft position 1..K (list index k - 1): draft tokens handed to
    # vLLM at that position / those the verifier accepted there
    draft_tokens_by: dict[str, list[int]] = field(default_factory=dict)
    accepted_by: dict[str, list[int]] = field(default_factory=dict)


def _domain_refusal(p: RequestParams) -> str | None:
    """Why ``p`` lies outside the sampling domain (the one check, docs/core.md), or None."""
    try:
        check_params_domain(p.temperature, p.top_k, p.top_p, p.seed)
    except BadSamplingParams as exc:
        return str(exc)
    return None


def _add_positions(by: dict[str, list[int]], mode: str, n: int) -> None:
    """Count one more at positions 1..n of ``mode``."""
    counts = by.setdefault(mode, [])
    counts.extend([0] * (n - len(counts)))
    for k in range(n):
        counts[k] += 1


@dataclass
class _Req:
    """The session's state of one vLLM request (mutable, session-private)."""

    wire_id: int  # u64 request id on the wire
    sent: int = 0  # committed tokens the drafter holds (0: the whole history is due)
    drafted: int = 0  # drafts it proposed last step
    mode: str = "sampled"  # their drafting mode (draft_mode)
    local: int = 0  # drafts made on the target last step instead (``hand_local``)
    refused: bool = False  # the drafter refused it: not asked again
    features: list[torch.Tensor] = field(default_factory=list)  # [n_i, width] chunks, in order
    feature_rows: int = 0  # committed positions the chunks cover


class DraftSession:
    """Per-engine state between vLLM and one DraftSource (one caller thread)."""

    def __init__(self, source: DraftSource, vocab_size: int, deadline_s: float) -> None:
        self.source = source  # where drafts come from
        self.vocab_size = vocab_size  # the target's V: every answer's ids lie below it
        self.deadline_s = deadline_s  # per-step budget: connecting and the round together
        self.counters = Counters()
        self._reqs: dict[str, _Req] = {}  # vLLM request id -> its state
        self._next_id = 1  # next wire request id (never reused within a session)
        self._epoch: int | None = None  # the source's connection epoch last seen
        self._connected = False  # whether this step's round can be sent
        self._deadline = 0.0  # this step's end (time.monotonic())
        self.last_round_s: float | None = None  # the last step's round time (None: not sent)

    @property
    def connected(self) -> bool:
        """Whether the source held a connection at the end of the last step (False from a
        failed connect or a dropped connection until a reconnect succeeds)."""
        return self._connected

    @property
    def greedy_items(self) -> bool:
        """Whether requests may ask for greedy drafts (``StepRequest.greedy``): the source is
        a SAMPLED drafter whose HELLO declared POINT_MASS (docs/wire.md 3.2, 3.3)."""
        h = self.source.hello
        return (self._connected and h is not None and h.mode == DraftMode.SAMPLED
                and QKind.POINT_MASS in h.q_encodings)

    @property
    def features(self) -> FeatureSpec | None:
        """The context features adapters must hand over (None: none)."""
        return self.source.features

    # ---- one step -------------------------------------------------------------------------

    def begin(self, live: Collection[str]) -> None:
        """Start a step: release every request not in ``live``, then connect if needed
        (within the step's budget); a new connection epoch makes every history due whole."""
        self._deadline = time.monotonic() + self.deadline_s
        self.last_round_s = None
        gone = [rid for rid in self._reqs if rid not in live]
        if gone:
            self._release(tuple(self._reqs.pop(rid).wire_id for rid in gone))
        epoch = self._guard("connecting", lambda: self.source.ensure_connected(self.deadline_s))
        if isinstance(epoch, MissingReason):
            epoch = None
        self._connected = epoch is not None
        if epoch is not None and epoch != self._epoch:
            for r in self._reqs.values():
                r.sent = 0
            self._epoch = epoch

    def needed_from(self, req_id: str, n: int) -> int:
        """The first committed position of ``req_id`` this step needs (call after ``begin``):
        0 when the whole history is due, n when the request will not be sent."""
        r = self._reqs.get(req_id)
        if not self._connected or (r is not None and r.refused):
            return n
        return 0 if r is None or n < r.sent else r.sent

    def step(self, reqs: Sequence[StepRequest]) -> list[Drafts | None]:
        """Ask for drafts for ``reqs``; per request (in order) its Drafts, or None."""
        starts = self._check(reqs)
        out: list[Drafts | None] = [None] * len(reqs)
        # per request asked: its item, or its answer already known (never sent)
        asked: list[tuple[int, ProposeItem | Missing]] = []
        for i, (sr, start) in enumerate(zip(reqs, starts, strict=True)):
            r = self._reqs.get(sr.req_id) or self._new(sr.req_id)
            self._count_accepted(r, sr)
            r.local = 0
            if r.refused or sr.depth <= 0 or sr.length == 0:
                r.drafted = 0
                continue
            why = _domain_refusal(sr.params)
            if why is not None:  # the drafter would refuse it; the encoder might refuse the round
                log.warning("specpair: request %s refused before it is sent (its step stays "
                            "target-only): %s", sr.req_id, why)
                asked.append((i, Missing(MissingReason.REFUSED)))
                continue
            if sr.length < r.sent:  # preempted and recomputed: the drafter's copy is wrong
                self._restart(r)
            if self._connected and start == sr.length:
                continue  # nothing new committed (does not happen on a decode step)
            with_features = self.source.features is not None
            if with_features:
                self._commit_features(r, sr)
            if not self._connected:
                asked.append((i, Missing(MissingReason.DISCONNECTED)))
                continue
            accepted = max(0, min(r.drafted, sr.num_sampled - 1)) if start else 0
            asked.append((i, ProposeItem(r.wire_id, sr.new_tokens, accepted, sr.length,
                                         sr.depth, sr.params,
                                         self._rows_from(r, start) if with_features else None,
                                         sr.greedy)))
        if not asked:
            return out
        self.counters.rounds += 1
        self.counters.items += len(asked)
        items = [it for _, it in asked if isinstance(it, ProposeItem)]
        got: list[Drafts | Missing] = []
        if items:
            sent = time.monotonic()
            got = self._ask(items)
            self.last_round_s = time.monotonic() - sent
        replies = iter(got)
        answers = [next(replies) if isinstance(it, ProposeItem) else it for _, it in asked]
        for (i, _), ans in zip(asked, answers, strict=True):
            r = self._reqs[reqs[i].req_id]
            r.drafted = 0
            if isinstance(ans, Missing):
                self._missing(r, ans.reason)
                if ans.reason.value in _LINK_LOST:
                    self._connected = False
                continue
            r.sent = reqs[i].length
            r.drafted, r.mode = ans.depth, draft_mode(ans)
            self.counters.drafted += 1
            self.counters.draft_tokens += ans.depth
            _add_positions(self.counters.draft_tokens_by, r.mode, ans.depth)
            out[i] = ans
        return out

    def hand_local(self, req_id: str, depth: int, mode: str) -> None:
        """``depth`` drafts of ``req_id`` made on the target this step (n-gram drafts, label
        ``mode``) go to the verifier: counted as handed, and their acceptance at the next
        step, like the drafter's; the drafter itself is told nothing (its next round reports
        0 of its own drafts accepted and sends the tokens committed meanwhile). Call after
        ``step``, which asked the drafter nothing for the request."""
        r = self._reqs[req_id]
        r.local, r.mode = depth, mode
        self.counters.draft_tokens += depth
        _add_positions(self.counters.draft_tokens_by, mode, depth)

    def withdraw(self, req_ids: Collection[str]) -> None:
        """The drafts the last ``step`` gave ``req_ids`` never reached the verifier (the
        target's tensor-parallel guard dropped the step, ``specpair.vllm.drafting``): they
        count as neither handed nor awaiting acceptance. The drafter's copy stays valid: its
        next round reports 0 of them accepted."""
        for rid in req_ids:
            r = self._reqs.get(rid)
            if r is None or not (r.drafted or r.local):
                continue
            self.counters.drafted -= r.drafted > 0
            self.counters.draft_tokens -= r.drafted + r.local
            handed = self.counters.draft_tokens_by[r.mode]
            for k in range(r.drafted + r.local):
                handed[k] -= 1
            r.drafted = r.local = 0

    def _count_accepted(self, r: _Req, sr: StepRequest) -> None:
        """Count the drafts of ``r`` handed to vLLM last step (the drafter's or local ones)
        that the verifier accepted: ``num_sampled - 1`` of them (at most those handed), at
        positions 1, 2, ..."""
        handed = r.drafted + r.local  # (one of the two is 0)
        if not handed or sr.num_sampled <= 0 or sr.length < r.sent:
            return  # nothing drafted, nothing verified yet, or preempted (never verified)
        _add_positions(self.counters.accepted_by, r.mode, min(handed, sr.num_sampled - 1))

    # ---- internals ------------------------------------------------------------------------

    def _check(self, reqs: Sequence[StepRequest]) -> list[int]:
        """Each request's start (``needed_from``); raise ValueError before any change."""
        if len({sr.req_id for sr in reqs}) != len(reqs):
            raise ValueError("step() got the same request twice")
        starts = []
        spec = self.source.features
        for sr in reqs:
            start = self.needed_from(sr.req_id, sr.length)
            starts.append(start)
            if sr.depth <= 0:
                continue
            if sr.greedy and not self.greedy_items:
                raise ValueError(f"request {sr.req_id}: greedy drafts asked of a source that "
                                 "does not serve them (greedy_items is False)")
            t = sr.new_tokens
            if t.dtype != torch.int64 or t.ndim != 1 or t.shape[0] != sr.length - start:
                raise ValueError(f"request {sr.req_id}: new_tokens must be the "
                                 f"[{sr.length - start}] int64 tokens from position {start} "
                                 f"of {sr.length}, got {tuple(t.shape)} {t.dtype}")
            f = sr.features
            if f is not None and (spec is None or f.dtype != spec.dtype or f.ndim != 2
                                  or f.shape[1] != spec.width or f.shape[0] > sr.length):
                raise ValueError(f"request {sr.req_id}: features {tuple(f.shape)} {f.dtype} "
                                 f"do not match {spec} (at most {sr.length} rows)")
        return starts

    def _new(self, req_id: str) -> _Req:
        r = self._reqs[req_id] = _Req(self._next_id)
        self._next_id += 1
        return r

    def _restart(self, r: _Req) -> None:
        """Forget the drafter's copy: release it; resend whole under a new wire id."""
        self._release((r.wire_id,))
        r.wire_id, r.sent, r.drafted = self._next_id, 0, 0
        self._next_id += 1

    def _missing(self, r: _Req, reason: MissingReason) -> None:
        if reason == MissingReason.RESYNC:
            self.counters.resync += 1
            r.sent = 0
        elif reason == MissingReason.REFUSED:
            self.counters.refused += 1
            r.refused = True
        else:
            self.counters.missing += 1
            by = self.counters.missing_by_reason
            by[reason.value] = by.get(reason.value, 0) + 1
            self._restart(r)

    def _ask(self, items: list[ProposeItem]) -> list[Drafts | Missing]:
        """One round through the source, within the step's deadline."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            return [Missing(MissingReason.LATE)] * len(items)
        got = self._guard("asking for drafts", lambda: self._answers(items, left))
        return got if isinstance(got, list) else [Missing(got)] * len(items)

    def _answers(self, items: list[ProposeItem], left: float) -> list[Drafts | Missing]:
        answers = self.source.propose(items, left)
        if not isinstance(answers, list) or len(answers) != len(items):
            raise TypeError(f"the source answered {type(answers).__name__} "
                            f"{len(answers)} for {len(items)} items")
        out: list[Drafts | Missing] = []
        for it, a in zip(items, answers, strict=True):
            if isinstance(a, Missing):
                out.append(a)
            elif (isinstance(a, DraftItem) and a.request_id == it.request_id
                  and a.status == ItemStatus.OK and a.tokens.shape == (it.depth,)):
                d = Drafts(a.tokens, a.kind, a.q_logp, a.q_ids)
                if not d.fits(self.vocab_size):
                    raise ValueError(f"request {it.request_id}: drafts or q outside the "
                                     f"target's vocabulary of {self.vocab_size}")
                out.append(d)
            else:
                raise TypeError(f"the source answered {a!r} for request {it.request_id}")
        return out

    def _release(self, wire_ids: tuple[int, ...]) -> None:
        self._guard("releasing requests", lambda: self.source.release(wire_ids))

    def _guard(self, what: str, call: Callable[[], T]) -> T | MissingReason:
        """``call()``, or why it failed: a documented wire failure is logged (WARNING) and
        is DISCONNECTED / INVALID; anything else is logged with its traceback (ERROR),
        counted in ``errors`` and is ERROR."""
        try:
            return call()
        except OSError as exc:
            log.warning("specpair: drafter failure while %s: %s", what, exc)
            reason = MissingReason.DISCONNECTED
        except WireError as exc:
            log.warning("specpair: drafter failure while %s: %s", what, exc)
            reason = MissingReason.INVALID
        except Exception:
            log.exception("specpair: unexpected error while %s (a bug, counted in errors)", what)
            self.counters.errors += 1
            reason = MissingReason.ERROR
        return reason

    def _commit_features(self, r: _Req, sr: StepRequest) -> None:
        """Extend r's feature rows to cover all ``sr.length`` committed positions."""
        spec = self.source.features
        assert spec is not None
        n = sr.length
        if r.feature_rows > n:  # the history shrank (preempted): keep what still holds
            r.features = [torch.cat(r.features)[:n]] if n else []
            r.feature_rows = n
        need = n - r.feature_rows
        f = sr.features if sr.features is not None else torch.zeros(0, spec.width,
                                                                    dtype=spec.dtype)
        rows = f[f.shape[0] - min(need, f.shape[0]):]
        if need > rows.shape[0]:
            rows = torch.cat([rows.new_zeros(need - rows.shape[0], spec.width), rows])
        if need:
            r.features.append(rows)
            r.feature_rows = n

    def _rows_from(self, r: _Req, start: int) -> torch.Tensor:
        """[feature_rows - start, width] the committed feature rows from ``start`` on."""
        last = r.features[-1]
        first = r.feature_rows - last.shape[0]
        if start >= first:
            return last[start - first:]
        whole = torch.cat(r.features)
        r.features = [whole]
        return whole[start:]
