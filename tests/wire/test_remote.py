"""The drafting session (specpair.wire.session) over a scripted source."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from fake_source import PARAMS, FakeSource, K, V

from specpair import qlaw
from specpair.drafter.inprocess import InProcessSource
from specpair.wire.client import DraftClient
from specpair.wire.session import DraftSession, StepRequest
from specpair.wire.source import DraftSource, Missing, MissingReason

LIVE = {"a", "b", "c"}


def _step(s, reqs, live=LIVE):
    """One step the way an adapter drives it; ``reqs`` are (req id, committed tokens,
    tokens committed this step)."""
    s.begin(live)
    steps = []
    for rid, toks, sampled in reqs:
        n = len(toks)
        start = s.needed_from(rid, n)
        steps.append(StepRequest(rid, n, torch.tensor(toks[start:], dtype=torch.int64),
                                 sampled, K, PARAMS))
    return s.step(steps)


def test_both_sources_satisfy_the_protocol_and_answer_alike():
    from specpair.drafter.engine import DrafterEngine
    from specpair.wire.frames import ProposeItem

    model = SimpleNamespace(vocab_size=V, feature_spec=None, max_positions=64)
    engine = DrafterEngine(model, tokenizer_fingerprint=bytes(32), wire_version=1, max_depth=4)
    inproc = InProcessSource(engine)
    tcp = DraftClient("127.0.0.1", 9, b"k" * 32, vocab_size=V, tokenizer_fingerprint=bytes(32))
    assert isinstance(inproc, DraftSource) and isinstance(tcp, DraftSource)
    assert isinstance(FakeSource([]), DraftSource)
    assert inproc.ensure_connected(0.1) == 1 and inproc.features is None
    partial = ProposeItem(1, torch.tensor([3]), 0, 5, K, PARAMS, None)  # unknown request
    deep = ProposeItem(2, torch.tensor([3]), 0, 1, 9, PARAMS, None)  # deeper than max_depth
    assert inproc.propose([partial, deep], 0.1) == [Missing(MissingReason.RESYNC),
                                                   Missing(MissingReason.REFUSED)]


def test_history_is_sent_incrementally_and_missing_restarts():
    c = FakeSource(["ok", "ok", "missing", "ok"])
    r = DraftSession(c, V, 0.1)
    d = _step(r, [("a", [1, 2, 3], 1)])[0]
    assert d.tokens.tolist() == [0, 1, 2] and qlaw.logq(d, V).shape == (K, V)
    first = c.batches[0][0]
    assert first.new_tokens.tolist() == [1, 2, 3] and first.position == 3
    _step(r, [("a", [1, 2, 3, 0, 1, 9], 3)])  # two drafts accepted + one new token
    second = c.batches[1][0]
    assert second.new_tokens.tolist() == [0, 1, 9] and second.num_accepted == 2
    assert second.request_id == first.request_id
    d = _step(r, [("a", [1, 2, 3, 0, 1, 9, 4], 1)])[0]
    assert d is None and r.counters.missing == 1  # target-only next step
    assert r.counters.missing_by_reason == {"late": 1}
    assert c.released == [(first.request_id,)]
    _step(r, [("a", [1, 2, 3, 0, 1, 9, 4, 5], 1)])
    again = c.batches[3][0]
    assert again.request_id != first.request_id and again.new_tokens.numel() == 8


def test_resync_refused_raise_and_release():
    c = FakeSource(["resync", "ok", "refused", "raise"])
    r = DraftSession(c, V, 0.1)
    assert _step(r, [("a", [1, 2], 1)])[0] is None and r.counters.resync == 1
    assert _step(r, [("a", [1, 2, 5], 1)])[0].depth == K
    assert c.batches[1][0].new_tokens.tolist() == [1, 2, 5]  # resent whole after RESYNC
    _step(r, [("b", [1, 2, 5, 6], 1), ("a", [1, 2, 5, 0, 7], 2)])  # both REFUSED
    assert r.counters.refused == 2
    n = len(c.batches)
    assert _step(r, [("b", [1, 2, 5, 6, 8], 1)])[0] is None
    assert len(c.batches) == n  # a refused request is not asked again
    assert r.needed_from("b", 5) == 5  # ... nor are its tokens wanted
    out = _step(r, [("c", [4, 4], 1)])  # the source raises OSError: MISSING, no crash
    assert out[0] is None and r.counters.missing == 1
    assert r.counters.missing_by_reason == {"disconnected": 1} and r.counters.errors == 0
    r.begin(set())
    assert len(c.released[-1]) == 3


def test_an_unexpected_exception_is_logged_counted_and_the_step_target_only(caplog):
    c = FakeSource(["bug", "garbage", "wide", "wire", "ok"])
    r = DraftSession(c, V, 0.1)
    with caplog.at_level(logging.WARNING, logger="specpair.wire.session"):
        for n in (2, 3, 4):
            assert _step(r, [("a", list(range(1, n + 1)), 1)]) == [None]
        assert _step(r, [("a", [1, 2, 3, 4, 5], 1)]) == [None]  # a documented wire error
    assert r.counters.errors == 3
    assert r.counters.missing_by_reason == {"error": 3, "invalid": 1}
    records = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(records) == 3 and all(rec.exc_info for rec in records)  # with the traceback
    for name in ("KeyError", "TypeError", "ValueError"):
        assert name in caplog.text
    assert _step(r, [("a", [1, 2, 3, 4, 5, 6], 1)])[0].depth == K  # drafting goes on
    assert c.batches[4][0].new_tokens.numel() == 6  # resent whole under a new id


def test_bad_steps_raise_and_change_nothing():
    c = FakeSource(["ok"])
    r = DraftSession(c, V, 0.1)
    r.begin(LIVE)
    good = StepRequest("a", 1, torch.tensor([1]), 1, K, PARAMS)
    with pytest.raises(ValueError, match="twice"):
        r.step([good, good])
    with pytest.raises(ValueError, match="from position 0"):  # the drafter lacks [0, 4)
        r.step([good, StepRequest("b", 5, torch.tensor([1]), 1, K, PARAMS)])
    with pytest.raises(ValueError, match="features"):  # this source declares none
        r.step([StepRequest("a", 1, torch.tensor([1]), 1, K, PARAMS, torch.zeros(1, 4))])
    assert r.counters.rounds == 0 and c.batches == [] and r.needed_from("a", 1) == 0
    assert r._reqs == {}


def test_preempted_request_starts_over_and_a_new_epoch_resends_whole():
    c = FakeSource(["ok", "ok", "ok"])
    r = DraftSession(c, V, 0.1)
    _step(r, [("a", [1, 2, 3, 4], 1)])
    first = c.batches[0][0].request_id
    assert r.needed_from("a", 6) == 4
    _step(r, [("a", [1, 2], 1)])  # the history shrank (preempted, recomputed)
    assert c.released == [(first,)] and c.batches[1][0].new_tokens.tolist() == [1, 2]
    assert c.batches[1][0].request_id != first
    c.ensure_connected = lambda timeout_s: 2  # a new connection: the drafter may be new
    r.begin(LIVE)
    assert r.needed_from("a", 3) == 0
    _step(r, [("a", [1, 2, 7], 1)])
    assert c.batches[2][0].new_tokens.tolist() == [1, 2, 7] and c.batches[2][0].num_accepted == 0


def test_disconnected_steps_ask_for_no_tokens():
    c = FakeSource([])
    c.ensure_connected = lambda timeout_s: None
    r = DraftSession(c, V, 0.1)
    r.begin(LIVE)
    assert r.needed_from("a", 5) == 5
    out = r.step([StepRequest("a", 5, torch.zeros(0, dtype=torch.int64), 1, K, PARAMS)])
    assert out == [None] and c.batches == []
    assert r.counters.missing_by_reason == {"disconnected": 1}


def test_greedy_drafts_are_asked_only_of_a_drafter_serving_them(tiny_pair):
    """A SAMPLED in-process drafter serves greedy items: a request asking for them gets
    argmax drafts (POINT_MASS), the one beside it sampled ones; a source without such a
    HELLO (the scripted one) does not, and asking it is the adapter's bug (ValueError,
    before anything changes)."""
    from specpair.drafter.engine import DrafterEngine
    from specpair.drafter.model import HFDraftModel
    from specpair.proposal import QKind

    engine = DrafterEngine(HFDraftModel(tiny_pair.draft), tokenizer_fingerprint=bytes(32),
                           wire_version=1)
    s = DraftSession(InProcessSource(engine), engine.model.vocab_size, 5.0)
    s.begin({"g", "s"})
    assert s.greedy_items
    toks = torch.tensor([1, 5, 6, 7])
    got = s.step([StepRequest("g", 4, toks, 1, 3, PARAMS, greedy=True),
                  StepRequest("s", 4, toks, 1, 3, PARAMS)])
    assert [d.kind for d in got] == [QKind.POINT_MASS, QKind.DENSE]  # top-k off: DENSE
    fake = DraftSession(FakeSource(["ok"]), V, 0.1)
    fake.begin({"g"})
    assert not fake.greedy_items
    with pytest.raises(ValueError, match="greedy"):
        fake.step([StepRequest("g", 3, torch.tensor([1, 2, 3]), 1, K, PARAMS, greedy=True)])
