"""Target-side bookkeeping of the remote drafter, shared by the V1 and V2 speculators.

One ``RemoteDrafts`` per engine maps vLLM's request ids to wire request ids,
remembers how much of each request's committed history the drafter has, and
turns one decode step into one PROPOSE round through a draft client:

    client.propose(batch: Sequence[ProposeItem], deadline_s: float)
        -> per request (a mapping by request_id, or a sequence in batch order)
           a verified DraftItem, or anything else (the MISSING sentinel)

A request whose answer is not an OK DraftItem gets NO drafts this step (the
next step is target-only and exact); MISSING also forgets the drafter's copy of
the request (released, resent whole under a new wire id), RESYNC resends it
whole, REFUSED stops asking for it. q is never guessed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from specpair.proposal import QKind
from specpair.wire.frames import DraftItem, ItemStatus, ProposeItem, RequestParams

__all__ = ["StepRequest", "Drafts", "Counters", "RemoteDrafts", "dense_logq"]


@dataclass(frozen=True)
class StepRequest:
    """One running request at a decode step, as the speculator sees it."""

    req_id: str  # vLLM's request id
    tokens: torch.Tensor  # [n] int64 committed tokens (prompt + accepted output)
    num_sampled: int  # tokens the target committed this step (1 + accepted drafts)
    depth: int  # K wanted (0 = do not draft this step)
    params: RequestParams  # temperature (0 = greedy), top_k (0 off), top_p, seed
    # [m, width] target states that predicted the LAST m committed tokens (m <= n), if the
    # drafter asks for features; rows the target no longer holds are sent as zeros
    features: torch.Tensor | None = None


@dataclass(frozen=True)
class Drafts:
    """One request's answer at a step."""

    tokens: torch.Tensor  # [k] int64 drafts; k == 0 means target-only next step
    logq: torch.Tensor | None  # [k, V] fp32 normalized log q, -inf outside support; None if k == 0


@dataclass
class Counters:
    """What the speculator saw (cumulative; read by tests and metrics)."""

    rounds: int = 0  # PROPOSE rounds sent
    items: int = 0  # request items sent
    drafted: int = 0  # items answered OK with drafts
    draft_tokens: int = 0  # draft tokens handed to vLLM
    missing: int = 0  # items whose answer was MISSING (late, dropped, invalid, drafter gone)
    resync: int = 0  # items answered RESYNC
    refused: int = 0  # items answered REFUSED
    dropped_at_verify: int = 0  # requests whose q was gone at verification (drafts dropped)


@dataclass
class _Req:
    wire_id: int  # u64 on the wire
    sent: int = 0  # committed tokens the drafter has
    drafted: int = 0  # drafts it proposed last round
    refused: bool = False  # the drafter refused it: stop asking


def dense_logq(item: DraftItem, vocab_size: int) -> torch.Tensor:
    """[K, vocab_size] fp32 log q, renormalized in float64, -inf outside the support."""
    k = int(item.tokens.numel())
    if item.kind == QKind.POINT_MASS:
        out = torch.full((k, vocab_size), float("-inf"), dtype=torch.float64)
        out.scatter_(1, item.tokens.view(k, 1), 0.0)
        return out.float()
    assert item.q_logp is not None
    lq = item.q_logp.double()
    if item.kind == QKind.SPARSE:
        assert item.q_ids is not None
        valid = item.q_ids >= 0
        lq = torch.where(valid, lq, float("-inf"))
        full = torch.full((k, vocab_size), float("-inf"), dtype=torch.float64)
        full.scatter_(1, torch.where(valid, item.q_ids, item.q_ids[:, :1]), torch.where(
            valid, lq, lq[:, :1]))
        lq = full
    elif lq.shape[1] < vocab_size:
        pad = torch.full((k, vocab_size - lq.shape[1]), float("-inf"), dtype=torch.float64)
        lq = torch.cat([lq, pad], dim=1)
    lq = lq - torch.logsumexp(lq, dim=1, keepdim=True)
    return lq.float()


@dataclass
class RemoteDrafts:
    """Per-engine state between vLLM and one draft client."""

    client: object  # has propose(batch, deadline_s)
    vocab_size: int  # the target's V (rows of q are padded to it)
    deadline_s: float  # per-round budget handed to the client
    counters: Counters = field(default_factory=Counters)  # what this engine saw
    _reqs: dict[str, _Req] = field(default_factory=dict)  # vLLM request id -> its wire state
    _next_id: int = 1  # next wire request id (u64, never reused within an engine)

    def _new(self, req_id: str) -> _Req:
        r = _Req(self._next_id)
        self._next_id += 1
        self._reqs[req_id] = r
        return r

    def forget(self, live: set[str]) -> None:
        """Release every tracked request not in ``live`` (finished or preempted away)."""
        gone = [rid for rid in self._reqs if rid not in live]
        if gone:
            self._release(tuple(self._reqs.pop(rid).wire_id for rid in gone))

    def _release(self, wire_ids: tuple[int, ...]) -> None:
        release = getattr(self.client, "release", None)
        if release is None:
            return
        with contextlib.suppress(Exception):  # a dead drafter must never stop the target
            release(wire_ids)

    def _restart(self, req_id: str) -> _Req:
        """Forget the drafter's copy of ``req_id``; it is resent whole under a new id."""
        self._release((self._reqs.pop(req_id).wire_id,))
        return self._new(req_id)

    def step(self, reqs: Sequence[StepRequest]) -> list[Drafts]:
        """One PROPOSE round for ``reqs``; returns their drafts in order."""
        empty = Drafts(torch.zeros(0, dtype=torch.int64), None)
        out: list[Drafts] = [empty] * len(reqs)
        batch: list[ProposeItem] = []
        where: list[int] = []
        for i, sr in enumerate(reqs):
            r = self._reqs.get(sr.req_id) or self._new(sr.req_id)
            n = int(sr.tokens.numel())
            if r.refused or sr.depth <= 0 or n == 0:
                r.drafted = 0
                continue
            if n < r.sent:  # history shrank (preempted and recomputed): start over
                r = self._restart(sr.req_id)
            start = r.sent
            num_accepted = max(0, min(r.drafted, sr.num_sampled - 1)) if start else 0
            if start == n:  # nothing new committed (should not happen on a decode step)
                continue
            feats = None
            if sr.features is not None:
                need, have = n - start, sr.features.shape[0]
                feats = sr.features[have - min(need, have):]
                if need > have:
                    pad = feats.new_zeros(need - have, feats.shape[1])
                    feats = torch.cat([pad, feats])
            batch.append(ProposeItem(r.wire_id, sr.tokens[start:].clone(), num_accepted, n,
                                     sr.depth, sr.params, feats))
            where.append(i)
        if not batch:
            return out
        self.counters.rounds += 1
        self.counters.items += len(batch)
        try:
            answers = self.client.propose(batch, self.deadline_s)
        except Exception:  # the contract says MISSING, never raise; be safe anyway
            answers = [None] * len(batch)
        if isinstance(answers, Mapping):
            answers = [answers.get(it.request_id) for it in batch]
        for it, i, ans in zip(batch, where, answers, strict=True):
            sr = reqs[i]
            r = self._reqs[sr.req_id]
            r.drafted = 0
            if not isinstance(ans, DraftItem) or ans.request_id != it.request_id:
                self.counters.missing += 1
                self._restart(sr.req_id)
                continue
            if ans.status == ItemStatus.RESYNC:
                self.counters.resync += 1
                r.sent = 0
                continue
            if ans.status != ItemStatus.OK:
                self.counters.refused += 1
                r.refused = True
                continue
            r.sent = it.position
            k = min(int(ans.tokens.numel()), sr.depth)
            if k == 0:
                continue
            r.drafted = k
            self.counters.drafted += 1
            self.counters.draft_tokens += k
            out[i] = Drafts(ans.tokens[:k].to(torch.int64), dense_logq(ans, self.vocab_size)[:k])
        return out


def env_seed() -> int:
    """A fresh 63-bit seed for requests that did not set one."""
    return int.from_bytes(os.urandom(8), "little") >> 1
