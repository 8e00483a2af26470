"""The drafting session over a scripted source, and the V1 / V2 adapters on tensors."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specpair import qlaw
from specpair.drafter.inprocess import InProcessSource
from specpair.proposal import QKind
from specpair.qlaw import Drafts
from specpair.vllm.v2 import merge_invalid_drafts, write_draft_logits
from specpair.wire.client import DraftClient
from specpair.wire.errors import TokenOutOfRange
from specpair.wire.frames import DraftItem, ItemStatus, RequestParams
from specpair.wire.session import DraftSession, StepRequest
from specpair.wire.source import DraftSource, Missing, MissingReason

V, K = 16, 3
PARAMS = RequestParams(temperature=1.0, top_k=0, top_p=1.0, seed=7)
LIVE = {"a", "b", "c", "x", "y"}


def _ok(item, k=K):
    logq = torch.log_softmax(torch.randn(k, V, generator=torch.Generator().manual_seed(1)), -1)
    return DraftItem(item.request_id, ItemStatus.OK, torch.arange(k, dtype=torch.int64),
                     QKind.DENSE, logq, None)


class FakeSource:
    """A DraftSource answering by script: 'ok', 'missing' (LATE), 'resync', 'refused',
    'raise' (an OSError, as a socket raises), 'wire' (a WireError), 'bug' (any other
    exception), 'garbage' / 'wide' (answers that break the contract)."""

    features = None

    def __init__(self, script):
        self.script, self.batches, self.released = list(script), [], []

    def ensure_connected(self, timeout_s):
        return 1

    def propose(self, batch, deadline_s):
        self.batches.append(list(batch))
        what = self.script.pop(0)
        if what == "raise":
            raise ConnectionError("drafter gone")
        if what == "wire":
            raise TokenOutOfRange("the encoder refused an item")
        if what == "bug":
            raise KeyError("a bug in the source")
        if what == "garbage":
            return [object()] * len(batch)
        if what == "wide":  # q over more tokens than the target has
            return [DraftItem(it.request_id, ItemStatus.OK, torch.arange(K), QKind.DENSE,
                              torch.log_softmax(torch.zeros(K, V + 1), -1), None)
                    for it in batch]
        reason = {"missing": MissingReason.LATE, "resync": MissingReason.RESYNC,
                  "refused": MissingReason.REFUSED}.get(what)
        return [_ok(it) if reason is None else Missing(reason) for it in batch]

    def release(self, ids):
        self.released.append(tuple(ids))


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


def test_write_draft_logits_stores_t_log_q_and_clears_stale_rows():
    buf = torch.zeros(6, K, V)  # stale garbage everywhere
    lq = torch.log_softmax(torch.randn(K, V), -1)
    lq[:, :4] = float("-inf")  # a truncated law, shipped DENSE
    lq = lq - torch.logsumexp(lq, -1, keepdim=True)
    drafts = [Drafts(torch.tensor([5, 6, 7]), QKind.DENSE, lq, None), None,
              Drafts(torch.tensor([8, 9, 10]), QKind.DENSE, lq, None)]
    tokens = write_draft_logits(buf, [4, 1, 2], drafts, [0.5, 1.0, 0.0])
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 0], [8, 9, 10]]
    # what the verifier reads: draft_logits / T, softmaxed -> exactly q
    assert torch.allclose(torch.softmax(buf[4] / 0.5, -1), lq.exp(), atol=1e-6)
    assert torch.isinf(buf[4, :, :4]).all()
    assert torch.isneginf(buf[1]).all() and torch.isneginf(buf[2]).all()  # MISSING / greedy
    assert (buf[0] == 0).all()  # rows of requests not in the step are left alone


def test_merge_invalid_drafts_marks_rows_beyond_the_valid_drafts():
    spec = SimpleNamespace(num_valid=torch.tensor([3, 0, 1], dtype=torch.int32))
    # two requests (state rows 1 and 2), K=3: logits rows at local positions 0..3 each
    batch = SimpleNamespace(expanded_idx_mapping=torch.tensor([1] * 4 + [2] * 4),
                            expanded_local_pos=torch.tensor([0, 1, 2, 3] * 2))
    mask = merge_invalid_drafts(spec, batch, None)
    assert mask.tolist() == [False, True, True, True, False, False, True, True]
    grammar = torch.tensor([False] * 7 + [True])
    assert merge_invalid_drafts(spec, batch, grammar)[7]
    spec.num_valid[:] = 3
    assert merge_invalid_drafts(spec, batch, None) is None


def _v2(depth=K, max_reqs=4, method="standard"):
    from specpair.vllm.v2 import RemoteSpeculator

    spec = SimpleNamespace(num_speculative_tokens=depth, rejection_sample_method=method,
                           enable_adaptive_verification=False)
    model = SimpleNamespace(get_vocab_size=lambda: V, max_model_len=64, tokenizer="unused")
    cfg = SimpleNamespace(speculative_config=spec, model_config=model,
                          scheduler_config=SimpleNamespace(max_num_seqs=max_reqs))
    tokens = torch.zeros(max_reqs, 64, dtype=torch.int32)
    total = torch.zeros(max_reqs, dtype=torch.int32)
    states = SimpleNamespace(total_len=SimpleNamespace(gpu=total),
                             all_token_ids=SimpleNamespace(gpu=tokens))
    return RemoteSpeculator(cfg, torch.device("cpu"), states), states


def _batch(req_ids, idx, qs):
    return SimpleNamespace(num_reqs=len(req_ids), req_ids=req_ids,
                           idx_mapping=torch.tensor(idx), idx_mapping_np=torch.tensor(idx).numpy(),
                           query_start_loc_np=torch.tensor(qs).numpy())


def test_v2_speculator_step_writes_q_and_flags_missing():
    from specpair.vllm.errors import RemoteVerificationRefused

    with pytest.raises(RemoteVerificationRefused, match="block"):
        _v2(method="block")
    spec, states = _v2()
    spec.source = FakeSource(["ok", "missing"])
    states.total_len.gpu[2] = 4
    states.all_token_ids.gpu[2, :4] = torch.tensor([3, 4, 5, 6], dtype=torch.int32)
    states.total_len.gpu[0] = 2
    batch = _batch(["x", "y"], [2, 0], [0, 4, 6])
    temp = torch.tensor([0.0, 0.0, 0.5, 0.0])
    args = (batch, None, None, torch.zeros(6, 8), None, torch.tensor([1, 0]),
            torch.tensor([0, 0]), None, None, temp, torch.arange(4))
    drafts = spec.propose(*args)
    assert drafts.tolist() == [[0, 1, 2], [0, 0, 0]]  # y is still in prefill: no drafts
    sent = spec.source.batches[0]
    assert [it.new_tokens.tolist() for it in sent] == [[3, 4, 5, 6]]
    assert sent[0].params.temperature == 0.5 and sent[0].features is None
    q = torch.softmax(spec.draft_logits[2] / 0.5, -1)
    assert torch.allclose(q, _ok(sent[0]).q_logp.exp(), atol=1e-6)
    assert spec.num_valid.tolist() == [K, K, K, K]
    # next step: the drafter is gone -> x keeps -inf rows and num_valid 0 (invalid drafts)
    states.total_len.gpu[2] = 6
    states.all_token_ids.gpu[2, 4:6] = torch.tensor([0, 9], dtype=torch.int32)
    args = (batch, None, None, torch.zeros(6, 8), None, torch.tensor([2, 0]),
            torch.tensor([2, 0]), None, None, temp, torch.arange(4))
    spec.propose(*args)
    assert spec.source.batches[1][0].new_tokens.tolist() == [0, 9]
    assert spec.source.batches[1][0].num_accepted == 1
    assert torch.isneginf(spec.draft_logits[2]).all() and spec.num_valid[2] == 0
    assert spec.remote.counters.missing == 1


def test_v2_sends_the_features_the_client_declared():
    from specpair.wire.frames import FeatureKind, FeatureSpec

    spec, states = _v2()
    spec.source = FakeSource(["ok", "ok"])
    spec.source.features = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 8)
    states.total_len.gpu[1] = 4  # prompt of 3 + the first sampled token
    hidden = torch.arange(6 * 8, dtype=torch.float32).view(6, 8)
    batch = _batch(["x"], [1], [0, 3])
    temp = torch.ones(4)
    spec.propose(batch, None, None, hidden, None, torch.tensor([1]), torch.tensor([0]),
                 None, None, temp, torch.arange(4))
    f = spec.source.batches[0][0].features
    # 4 new tokens, 3 query rows (the prompt): token 0 has no predicting state (zeros)
    assert f.shape == (4, 8) and (f[0] == 0).all() and torch.equal(f[1:], hidden[:3])
    states.total_len.gpu[1] = 6  # 1 draft accepted + 1 new token; query was 1 + K rows
    batch = _batch(["x"], [1], [0, 1 + K])
    spec.propose(batch, None, None, hidden, None, torch.tensor([2]), torch.tensor([K - 1]),
                 None, None, temp, torch.arange(4))
    f = spec.source.batches[1][0].features
    assert torch.equal(f, hidden[:2])  # the states that predicted the 2 new tokens


class Recorded:
    """A tensor whose reads are recorded (which slices of the device history V2 copies)."""

    def __init__(self, t):
        self.t, self.keys = t, []

    def __getitem__(self, key):
        self.keys.append(key)
        return self.t[key]

    def __setitem__(self, key, value):
        self.t[key] = value


def test_v2_copies_only_the_tokens_the_drafter_lacks():
    spec, states = _v2()
    spec.source = FakeSource(["ok", "ok", "ok"])
    states.all_token_ids.gpu = Recorded(states.all_token_ids.gpu)
    batch = _batch(["x", "y"], [2, 0], [0, 4, 6])
    temp = torch.ones(4)

    def step(n, sampled, rejected):
        states.total_len.gpu[2] = n
        states.all_token_ids.gpu[2, :n] = torch.arange(1, n + 1, dtype=torch.int32)
        states.total_len.gpu[0] = 2
        spec.propose(batch, None, None, torch.zeros(6, 8), None, torch.tensor([sampled, 0]),
                     torch.tensor([rejected, 0]), None, None, temp, torch.arange(4))

    step(4, 1, 0)
    step(6, 2, 2)
    step(9, 3, 1)
    reads = [k for k in states.all_token_ids.gpu.keys if isinstance(k, tuple)]
    # request x: whole once, then only what was committed since; y (prefill): nothing
    assert reads == [(2, slice(0, 4)), (2, slice(4, 6)), (2, slice(6, 9))]
    assert [b[0].new_tokens.tolist() for b in spec.source.batches] == [
        [1, 2, 3, 4], [5, 6], [7, 8, 9]]


def test_v2_whole_resend_carries_the_feature_rows_already_sent():
    from specpair.wire.frames import FeatureKind, FeatureSpec

    spec, states = _v2()
    spec.source = FakeSource(["ok", "ok", "ok"])
    spec.source.features = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 8)
    hidden = torch.arange(6 * 8, dtype=torch.float32).view(6, 8)
    temp = torch.ones(4)
    states.total_len.gpu[1] = 4
    spec.propose(_batch(["x"], [1], [0, 3]), None, None, hidden, None, torch.tensor([1]),
                 torch.tensor([0]), None, None, temp, torch.arange(4))
    states.total_len.gpu[1] = 6
    spec.propose(_batch(["x"], [1], [0, 1 + K]), None, None, hidden, None, torch.tensor([2]),
                 torch.tensor([K - 1]), None, None, temp, torch.arange(4))
    spec.source.ensure_connected = lambda timeout_s: 2  # reconnected: whole histories due
    states.total_len.gpu[1] = 7
    spec.propose(_batch(["x"], [1], [0, 1 + K]), None, None, hidden * -1, None,
                 torch.tensor([1]), torch.tensor([K]), None, None, temp, torch.arange(4))
    whole = spec.source.batches[2][0]
    assert whole.position == whole.new_tokens.numel() == 7
    want = torch.cat([torch.zeros(1, 8), hidden[:3], hidden[:2], -hidden[:1]])
    assert torch.equal(whole.features, want)  # every row as first sent, none zeroed


def _v1(max_reqs=4):
    from specpair.vllm.v1 import RemoteProposer

    spec = SimpleNamespace(num_speculative_tokens=K)
    model = SimpleNamespace(get_vocab_size=lambda: V, max_model_len=64, tokenizer="unused")
    cfg = SimpleNamespace(speculative_config=spec, model_config=model,
                          scheduler_config=SimpleNamespace(max_num_seqs=max_reqs))
    return RemoteProposer(cfg)


def test_v1_reuses_one_q_buffer_and_hands_over_only_new_tokens():
    from specpair.vllm.v1 import propose_remote

    proposer = _v1()
    proposer.source = FakeSource(["ok", "ok"])
    sp = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0, seed=5)
    table = np.zeros((2, 16), dtype=np.int32)
    table[0, :5] = [1, 2, 3, 4, 5]
    table[1, :2] = [6, 7]
    runner = SimpleNamespace(
        drafter=proposer, device=torch.device("cpu"),
        requests={"a": SimpleNamespace(sampling_params=sp),
                  "b": SimpleNamespace(sampling_params=sp)},
        input_batch=SimpleNamespace(req_ids=["a", "b"], token_ids_cpu=table,
                                    num_tokens_no_spec=np.array([3, 2])))
    assert propose_remote(runner, [[3], [7]]) == [[0, 1, 2], [0, 1, 2]]
    buf = runner._draft_probs
    lq = _ok(proposer.source.batches[0][0]).q_logp
    want = qlaw.probs(Drafts(torch.arange(K), QKind.DENSE, lq, None), V)
    assert buf.shape == (2, K, V) and torch.equal(buf[0], want) and torch.equal(buf[1], want)
    runner.input_batch.num_tokens_no_spec = np.array([5, 2])
    assert propose_remote(runner, [[4, 5], []]) == [[0, 1, 2], []]  # b: nothing sampled
    assert runner._draft_probs.data_ptr() == buf.data_ptr()  # the same buffer, refilled
    assert torch.equal(runner._draft_probs[0], want) and (runner._draft_probs[1] == 0).all()
    second = proposer.source.batches[1]
    assert [it.new_tokens.tolist() for it in second] == [[4, 5]] and second[0].num_accepted == 1
    assert runner._draft_prob_req_ids == ["a", "b"]
