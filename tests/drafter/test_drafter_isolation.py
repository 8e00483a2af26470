"""Failure isolation per item and the engine's resource bounds.

A poisoned item (params outside docs/core.md's domain, or one whose drafting raises) is
answered REFUSED on its own; the other items of the same round are drafted normally. Live
requests are bounded (least recently used evicted: RESYNC when asked for again) and so is
each request's history (REFUSED past it).
"""

from __future__ import annotations

import logging

import pytest
import torch

from specpair.drafter.engine import DrafterEngine
from specpair.drafter.model import HFDraftModel
from specpair.models.tiny import TinyPair
from specpair.wire.frames import ItemStatus, Propose, ProposeItem, RequestParams

FP = bytes(32)
OK = RequestParams(1.0, 0, 1.0, 5)


def _item(rid: int, new: list[int], params: RequestParams = OK, position: int | None = None,
          depth: int = 3) -> ProposeItem:
    return ProposeItem(rid, torch.tensor(new, dtype=torch.int64), 0,
                       len(new) if position is None else position, depth, params, None)


@pytest.fixture(scope="module")
def draft_model(tiny_pair: TinyPair) -> HFDraftModel:
    return HFDraftModel(tiny_pair.draft)


@pytest.mark.parametrize("bad", [RequestParams(1e-40, 0, 1.0, 1), RequestParams(1e30, 0, 1.0, 1),
                                 RequestParams(1.0, 0, 1e-50, 1)])
def test_a_poisoned_item_is_refused_alone(draft_model: HFDraftModel, bad: RequestParams) -> None:
    """Temperature 1e-40 used to divide to inf/NaN and answer EVERY item RESYNC."""
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    for rnd in range(3):  # every round, not only the first
        got = engine.handle(Propose(rnd, (_item(1, [1, 5, 6]), _item(2, [1, 7], bad),
                                          _item(3, [1, 8, 9, 10]))))
        assert [i.status for i in got.items] == [ItemStatus.OK, ItemStatus.REFUSED,
                                                 ItemStatus.OK]
        assert got.items[0].tokens.numel() == 3 and got.items[2].tokens.numel() == 3
        assert all(bool(torch.isfinite(i.q_logp).any()) for i in got.items if i.tokens.numel())


def test_a_failing_item_is_refused_and_counted_the_others_drafted(
        draft_model: HFDraftModel, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    begin = draft_model.begin

    def poisoned(rows):  # a bug that strikes any batch holding token 13
        if any(13 in r.tokens.tolist() for r in rows):
            raise RuntimeError("boom")
        return begin(rows)

    monkeypatch.setattr(draft_model, "begin", poisoned)
    got = engine.handle(Propose(0, (_item(1, [1, 5]), _item(2, [1, 13]), _item(3, [1, 8]))))
    assert [i.status for i in got.items] == [ItemStatus.OK, ItemStatus.REFUSED, ItemStatus.OK]
    assert engine.metrics.draft_failures == 1 and engine.live_requests() == 2
    assert "specpair_drafter_draft_failures_total 1" in engine.metrics.render()
    assert "RuntimeError: boom" in caplog.text  # logged with its traceback


def test_live_requests_are_bounded_lru_evicted_and_resynced(draft_model: HFDraftModel) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1, max_requests=3)
    for rid in range(1, 5):
        engine.handle(Propose(rid, (_item(rid, [1, rid + 10]),)))
        assert engine.live_requests() == min(rid, 3)
    assert engine.metrics.evicted == 1
    # request 1 was the least recently used: evicted, so its next delta is RESYNC
    d = engine.handle(Propose(9, (_item(1, [20], position=5),)))
    assert d.items[0].status == ItemStatus.RESYNC
    # a round larger than the bound keeps all its own requests until it is answered
    got = engine.handle(Propose(10, tuple(_item(r, [1, 2]) for r in range(20, 25))))
    assert all(i.status == ItemStatus.OK for i in got.items) and engine.live_requests() == 5


def test_history_is_bounded(draft_model: HFDraftModel) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1, max_history=8)
    got = engine.handle(Propose(0, (_item(1, list(range(1, 9))), _item(2, list(range(1, 10))))))
    assert [i.status for i in got.items] == [ItemStatus.OK, ItemStatus.REFUSED]
    assert engine.live_requests() == 1


def test_held_tokens_are_bounded_lru(draft_model: HFDraftModel) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1,
                           max_held_tokens=10)
    for rid in range(1, 4):
        engine.handle(Propose(rid, (_item(rid, [1, 2, 3, 4]),)))  # 4 tokens each
    assert engine.live_requests() == 2 and engine.held_tokens() == 8
    assert engine.handle(Propose(9, (_item(1, [5], position=5),))).items[0].status == \
        ItemStatus.RESYNC  # the least recently used went first


def test_requests_drafted_alone_then_together_then_alone(draft_model: HFDraftModel,
                                                         caplog) -> None:
    """A request's cache from a round of its own joins a batched round and leaves it again
    (as requests come and go in serving): every round drafts the batch as one, none falls
    back to drafting each request alone."""
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    hist = {1: [1, 5, 6, 7], 2: [1, 8, 9]}
    sent = {r: 0 for r in hist}
    for rnd, ids in enumerate([(1,), (1, 2), (1, 2), (2,), (1, 2)]):
        items = tuple(ProposeItem(r, torch.tensor(hist[r][sent[r]:]), 0, len(hist[r]), 3, OK,
                                  None) for r in ids)
        got = engine.handle(Propose(rnd, items))
        assert [it.status for it in got.items] == [ItemStatus.OK] * len(ids)
        for r, it in zip(ids, got.items, strict=True):
            sent[r] = len(hist[r])
            hist[r].append(int(it.tokens[0]) + 1 if int(it.tokens[0]) + 1 < 64 else 4)
    assert engine.metrics.draft_failures == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_kv_bytes_per_token(draft_model: HFDraftModel) -> None:
    """A request's cache holds its tokens' KV bytes, and room for at most an eighth more
    (at least kv.ROOM slots)."""
    from specpair.drafter.kv import capacity
    from specpair.drafter.model import cache_length

    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    engine.handle(Propose(0, (_item(1, [1, 2, 3, 4, 5]),)))
    cache = engine._states[1].cache
    n = cache_length(cache)
    per = draft_model.kv_bytes_per_token
    assert n * per <= cache.nbytes() <= capacity(n) * per
