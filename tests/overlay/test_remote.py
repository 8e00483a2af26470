"""The target-side remote drafter bookkeeping and the V2 draft_logits writer, on tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from specpair.draft import DraftMode, propose
from specpair.proposal import QKind
from specpair.sampling import SamplingParams
from specpair.vllm.remote import Drafts, RemoteDrafts, StepRequest, dense_logq
from specpair.vllm.v2 import merge_invalid_drafts, write_draft_logits
from specpair.wire.frames import DraftItem, ItemStatus, RequestParams

V, K = 16, 3
PARAMS = RequestParams(temperature=1.0, top_k=0, top_p=1.0, seed=7)


def _ok(item, k=K):
    logq = torch.log_softmax(torch.randn(k, V, generator=torch.Generator().manual_seed(1)), -1)
    return DraftItem(item.request_id, ItemStatus.OK, torch.arange(k, dtype=torch.int64),
                     QKind.DENSE, logq, None)


class FakeClient:
    """Answers by script: 'ok', 'missing', 'resync', 'refused', or 'raise'."""

    def __init__(self, script):
        self.script, self.batches, self.released = list(script), [], []

    def propose(self, batch, deadline_s):
        self.batches.append(list(batch))
        what = self.script.pop(0)
        if what == "raise":
            raise ConnectionError("drafter gone")
        out = []
        for it in batch:
            if what == "ok":
                out.append(_ok(it))
            elif what == "missing":
                out.append(object())  # anything but a DraftItem is MISSING
            else:
                status = ItemStatus.RESYNC if what == "resync" else ItemStatus.REFUSED
                out.append(DraftItem(it.request_id, status, torch.zeros(0, dtype=torch.int64),
                                     QKind.DENSE, None, None))
        return out

    def release(self, ids):
        self.released.append(tuple(ids))


def _req(tokens, sampled=1, rid="a"):
    return StepRequest(rid, torch.tensor(tokens, dtype=torch.int64), sampled, K, PARAMS)


def test_history_is_sent_incrementally_and_missing_restarts():
    c = FakeClient(["ok", "ok", "missing", "ok"])
    r = RemoteDrafts(c, V, 0.1)
    d = r.step([_req([1, 2, 3])])[0]
    assert d.tokens.tolist() == [0, 1, 2] and d.logq.shape == (K, V)
    first = c.batches[0][0]
    assert first.new_tokens.tolist() == [1, 2, 3] and first.position == 3
    r.step([_req([1, 2, 3, 0, 1, 9], sampled=3)])  # two drafts accepted + one new token
    second = c.batches[1][0]
    assert second.new_tokens.tolist() == [0, 1, 9] and second.num_accepted == 2
    assert second.request_id == first.request_id
    d = r.step([_req([1, 2, 3, 0, 1, 9, 4], sampled=1)])[0]
    assert d.tokens.numel() == 0 and r.counters.missing == 1  # target-only next step
    assert c.released == [(first.request_id,)]
    r.step([_req([1, 2, 3, 0, 1, 9, 4, 5])])
    again = c.batches[3][0]
    assert again.request_id != first.request_id and again.new_tokens.numel() == 8


def test_resync_refused_raise_and_release():
    c = FakeClient(["resync", "ok", "refused", "raise"])
    r = RemoteDrafts(c, V, 0.1)
    assert r.step([_req([1, 2])])[0].tokens.numel() == 0 and r.counters.resync == 1
    assert r.step([_req([1, 2, 5])])[0].tokens.numel() == K
    assert c.batches[1][0].new_tokens.tolist() == [1, 2, 5]  # resent whole after RESYNC
    r.step([_req([1, 2, 5, 6], rid="b"), _req([1, 2, 5, 0, 7], 2)])  # both REFUSED
    assert r.counters.refused == 2
    n = len(c.batches)
    assert r.step([_req([1, 2, 5, 6, 8], rid="b")])[0].tokens.numel() == 0
    assert len(c.batches) == n  # a refused request is not asked again
    out = r.step([_req([4, 4], rid="c")])  # the client raises: MISSING, no crash
    assert out[0].tokens.numel() == 0 and r.counters.missing == 1
    r.forget(set())
    assert len(c.released[-1]) == 3


def test_dense_logq_agrees_with_the_core_proposal():
    g = torch.Generator().manual_seed(3)
    params = SamplingParams.make(2, temperature=0.8, top_k=5, top_p=1.0, seed=11)
    logits = torch.randn(2, V, generator=g)
    prop = propose(logits, lambda d, k: torch.randn(2, V, generator=g), params,
                   torch.tensor([4, 9]), K, DraftMode.SAMPLED, 0)
    want = prop.normalized_logq().float() if prop.kind == QKind.DENSE else None
    for b in range(2):
        if prop.kind == QKind.SPARSE:
            item = DraftItem(b, ItemStatus.OK, prop.tokens[b], QKind.SPARSE,
                             prop.q_logp[b], prop.q_ids[b])
        else:
            item = DraftItem(b, ItemStatus.OK, prop.tokens[b], QKind.DENSE, prop.q_logp[b], None)
        lq = dense_logq(item, V + 4)  # padded to a larger target vocabulary
        assert torch.allclose(lq.exp().sum(-1), torch.ones(K))
        assert torch.isinf(lq[:, V:]).all()
        at = lq.gather(1, prop.tokens[b].view(K, 1)).squeeze(1).double()
        assert torch.allclose(at, prop.draft_logq()[b], atol=1e-5)
        assert (torch.isfinite(lq).sum(-1) <= (5 if prop.kind == QKind.SPARSE else V)).all()
        if want is not None:
            assert torch.allclose(lq[:, :V], want[b], atol=1e-6)
    pm = DraftItem(0, ItemStatus.OK, torch.tensor([3, 1, 2]), QKind.POINT_MASS, None, None)
    lq = dense_logq(pm, V)
    assert lq.exp()[torch.arange(3), torch.tensor([3, 1, 2])].eq(1).all()


def test_write_draft_logits_stores_t_log_q_and_clears_stale_rows():
    buf = torch.zeros(6, K, V)  # stale garbage everywhere
    lq = torch.log_softmax(torch.randn(K, V), -1)
    lq[:, :4] = float("-inf")  # a truncated law, renormalized as dense_logq returns it
    lq = lq - torch.logsumexp(lq, -1, keepdim=True)
    drafts = [Drafts(torch.tensor([5, 6, 7]), lq), Drafts(torch.zeros(0, dtype=torch.int64), None),
              Drafts(torch.tensor([8, 9, 10]), lq)]
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
    import pytest

    from specpair.vllm.errors import RemoteVerificationRefused

    with pytest.raises(RemoteVerificationRefused, match="block"):
        _v2(method="block")
    spec, states = _v2()
    spec.client = FakeClient(["ok", "missing"])
    states.total_len.gpu[2] = 4
    states.all_token_ids.gpu[2, :4] = torch.tensor([3, 4, 5, 6], dtype=torch.int32)
    states.total_len.gpu[0] = 2
    batch = _batch(["x", "y"], [2, 0], [0, 4, 6])
    temp = torch.tensor([0.0, 0.0, 0.5, 0.0])
    args = (batch, None, None, torch.zeros(6, 8), None, torch.tensor([1, 0]),
            torch.tensor([0, 0]), None, None, temp, torch.arange(4))
    drafts = spec.propose(*args)
    assert drafts.tolist() == [[0, 1, 2], [0, 0, 0]]  # y is still in prefill: no drafts
    sent = spec.client.batches[0]
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
    assert spec.client.batches[1][0].new_tokens.tolist() == [0, 9]
    assert spec.client.batches[1][0].num_accepted == 1
    assert torch.isneginf(spec.draft_logits[2]).all() and spec.num_valid[2] == 0
    assert spec.remote.counters.missing == 1


def test_v2_sends_the_features_the_client_declared():
    from specpair.wire.frames import FeatureKind, FeatureSpec

    spec, states = _v2()
    spec.client = FakeClient(["ok", "ok"])
    spec.client.features = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 8)
    states.total_len.gpu[1] = 4  # prompt of 3 + the first sampled token
    hidden = torch.arange(6 * 8, dtype=torch.float32).view(6, 8)
    batch = _batch(["x"], [1], [0, 3])
    temp = torch.ones(4)
    spec.propose(batch, None, None, hidden, None, torch.tensor([1]), torch.tensor([0]),
                 None, None, temp, torch.arange(4))
    f = spec.client.batches[0][0].features
    # 4 new tokens, 3 query rows (the prompt): token 0 has no predicting state (zeros)
    assert f.shape == (4, 8) and (f[0] == 0).all() and torch.equal(f[1:], hidden[:3])
    states.total_len.gpu[1] = 6  # 1 draft accepted + 1 new token; query was 1 + K rows
    batch = _batch(["x"], [1], [0, 1 + K])
    spec.propose(batch, None, None, hidden, None, torch.tensor([2]), torch.tensor([K - 1]),
                 None, None, temp, torch.arange(4))
    f = spec.client.batches[1][0].features
    assert torch.equal(f, hidden[:2])  # the states that predicted the 2 new tokens
