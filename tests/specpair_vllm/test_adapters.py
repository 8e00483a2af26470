"""The V1 and V2 adapters (specpair.vllm.v1 / v2) on tensors, over a scripted source."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fake_source import FakeSource, K, V, ok
from fake_vllm import v1_proposer, v2_batch, v2_speculator

from specpair import qlaw
from specpair.proposal import QKind
from specpair.qlaw import Drafts
from specpair.vllm.v2 import merge_invalid_drafts, write_draft_logits


@pytest.fixture(autouse=True)
def _fixed_depth(monkeypatch):
    """These tests check q and tokens at the configured K: the depth policy is pinned there
    (its own choices: test_depth_policy.py and the schedule test below)."""
    monkeypatch.setenv("SPECPAIR_DEPTH_POLICY", "fixed")

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


def test_v2_speculator_step_writes_q_and_flags_missing():
    from specpair.vllm.errors import RemoteVerificationRefused

    with pytest.raises(RemoteVerificationRefused, match="block"):
        v2_speculator(method="block")
    spec, states = v2_speculator()
    spec.drafting.source = FakeSource(["ok", "missing"])
    states.total_len.gpu[2] = 4
    states.all_token_ids.gpu[2, :4] = torch.tensor([3, 4, 5, 6], dtype=torch.int32)
    states.total_len.gpu[0] = 2
    batch = v2_batch(["x", "y"], [2, 0], [0, 4, 6])
    temp = torch.tensor([0.0, 0.0, 0.5, 0.0])
    args = (batch, None, None, torch.zeros(6, 8), None, torch.tensor([1, 0]),
            torch.tensor([0, 0]), None, None, temp, torch.arange(4))
    drafts = spec.propose(*args)
    assert drafts.tolist() == [[0, 1, 2], [0, 0, 0]]  # y is still in prefill: no drafts
    sent = spec.drafting.source.batches[0]
    assert [it.new_tokens.tolist() for it in sent] == [[3, 4, 5, 6]]
    assert sent[0].params.temperature == 0.5 and sent[0].features is None
    q = torch.softmax(spec.draft_logits[2] / 0.5, -1)
    assert torch.allclose(q, ok(sent[0]).q_logp.exp(), atol=1e-6)
    assert spec.num_valid.tolist() == [K, K, K, K]
    # next step: the drafter is gone -> x keeps -inf rows and num_valid 0 (invalid drafts)
    states.total_len.gpu[2] = 6
    states.all_token_ids.gpu[2, 4:6] = torch.tensor([0, 9], dtype=torch.int32)
    args = (batch, None, None, torch.zeros(6, 8), None, torch.tensor([2, 0]),
            torch.tensor([2, 0]), None, None, temp, torch.arange(4))
    spec.propose(*args)
    assert spec.drafting.source.batches[1][0].new_tokens.tolist() == [0, 9]
    assert spec.drafting.source.batches[1][0].num_accepted == 1
    assert torch.isneginf(spec.draft_logits[2]).all() and spec.num_valid[2] == 0
    assert spec.drafting.remote.counters.missing == 1


def test_v2_sends_the_features_the_client_declared():
    from specpair.wire.frames import FeatureKind, FeatureSpec

    spec, states = v2_speculator()
    spec.drafting.source = FakeSource(["ok", "ok"])
    spec.drafting.source.features = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 8)
    states.total_len.gpu[1] = 4  # prompt of 3 + the first sampled token
    hidden = torch.arange(6 * 8, dtype=torch.float32).view(6, 8)
    batch = v2_batch(["x"], [1], [0, 3])
    temp = torch.ones(4)
    spec.propose(batch, None, None, hidden, None, torch.tensor([1]), torch.tensor([0]),
                 None, None, temp, torch.arange(4))
    f = spec.drafting.source.batches[0][0].features
    # 4 new tokens, 3 query rows (the prompt): token 0 has no predicting state (zeros)
    assert f.shape == (4, 8) and (f[0] == 0).all() and torch.equal(f[1:], hidden[:3])
    states.total_len.gpu[1] = 6  # 1 draft accepted + 1 new token; query was 1 + K rows
    batch = v2_batch(["x"], [1], [0, 1 + K])
    spec.propose(batch, None, None, hidden, None, torch.tensor([2]), torch.tensor([K - 1]),
                 None, None, temp, torch.arange(4))
    f = spec.drafting.source.batches[1][0].features
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
    spec, states = v2_speculator()
    spec.drafting.source = FakeSource(["ok", "ok", "ok"])
    states.all_token_ids.gpu = Recorded(states.all_token_ids.gpu)
    batch = v2_batch(["x", "y"], [2, 0], [0, 4, 6])
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
    assert [b[0].new_tokens.tolist() for b in spec.drafting.source.batches] == [
        [1, 2, 3, 4], [5, 6], [7, 8, 9]]


def test_v2_whole_resend_carries_the_feature_rows_already_sent():
    from specpair.wire.frames import FeatureKind, FeatureSpec

    spec, states = v2_speculator()
    spec.drafting.source = FakeSource(["ok", "ok", "ok"])
    spec.drafting.source.features = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 8)
    hidden = torch.arange(6 * 8, dtype=torch.float32).view(6, 8)
    temp = torch.ones(4)
    states.total_len.gpu[1] = 4
    spec.propose(v2_batch(["x"], [1], [0, 3]), None, None, hidden, None, torch.tensor([1]),
                 torch.tensor([0]), None, None, temp, torch.arange(4))
    states.total_len.gpu[1] = 6
    spec.propose(v2_batch(["x"], [1], [0, 1 + K]), None, None, hidden, None, torch.tensor([2]),
                 torch.tensor([K - 1]), None, None, temp, torch.arange(4))
    spec.drafting.source.ensure_connected = lambda timeout_s: 2  # reconnected: whole histories due
    states.total_len.gpu[1] = 7
    spec.propose(v2_batch(["x"], [1], [0, 1 + K]), None, None, hidden * -1, None,
                 torch.tensor([1]), torch.tensor([K]), None, None, temp, torch.arange(4))
    whole = spec.drafting.source.batches[2][0]
    assert whole.position == whole.new_tokens.numel() == 7
    want = torch.cat([torch.zeros(1, 8), hidden[:3], hidden[:2], -hidden[:1]])
    assert torch.equal(whole.features, want)  # every row as first sent, none zeroed


def test_v1_reuses_one_q_buffer_and_hands_over_only_new_tokens():
    from specpair.vllm.v1 import propose_remote

    proposer = v1_proposer()
    proposer.drafting.source = FakeSource(["ok", "ok"])
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
    lq = ok(proposer.drafting.source.batches[0][0]).q_logp
    want = qlaw.probs(Drafts(torch.arange(K), QKind.DENSE, lq, None), V)
    assert buf.shape == (2, K, V) and torch.equal(buf[0], want) and torch.equal(buf[1], want)
    runner.input_batch.num_tokens_no_spec = np.array([5, 2])
    assert propose_remote(runner, [[4, 5], []]) == [[0, 1, 2], []]  # b: nothing sampled
    assert runner._draft_probs.data_ptr() == buf.data_ptr()  # the same buffer, refilled
    assert torch.equal(runner._draft_probs[0], want) and (runner._draft_probs[1] == 0).all()
    second = proposer.drafting.source.batches[1]
    assert [it.new_tokens.tolist() for it in second] == [[4, 5]] and second[0].num_accepted == 1
    assert runner._draft_prob_req_ids == ["a", "b"]


def test_v1_q_rows_scatter_sparse_q_and_clear_what_the_last_step_wrote():
    """QRows against a fresh qlaw.probs per step: SPARSE (ragged supports), DENSE, POINT_MASS
    and MISSING rows in any order leave no stale value behind, in one buffer."""
    from specpair.vllm.v1 import QRows

    g = torch.Generator().manual_seed(3)

    def sparse(s: int, cut: int) -> Drafts:
        ids = torch.stack([torch.randperm(V, generator=g)[:s] for _ in range(K)])
        lp = torch.log_softmax(torch.randn(K, s, generator=g), -1)
        ids[:, cut:] = -1  # padding after `cut` valid ids
        lp = torch.where(ids >= 0, lp, float("-inf"))
        return Drafts(ids[:, 0].clone(), QKind.SPARSE, lp - lp.logsumexp(-1, keepdim=True), ids)

    dense = Drafts(torch.tensor([1, 2]), QKind.DENSE, torch.log_softmax(torch.randn(2, V), -1),
                   None)
    point = Drafts(torch.tensor([4, 5, 6]), QKind.POINT_MASS, None, None)
    q = QRows(K, V, max_rows=4)
    steps = [[sparse(9, 9), dense, None, point], [sparse(5, 2), sparse(9, 4), point],
             [None, sparse(3, 3), sparse(7, 7)], [dense, None, point], [sparse(2, 1)]]
    first = None
    for drafts in steps:
        got = q.write(drafts)
        first = got.data_ptr() if first is None else first
        assert got.data_ptr() == first and got.shape == (len(drafts), K, V)
        for i, d in enumerate(drafts):
            k = 0 if d is None else d.depth
            if d is not None and d.kind == QKind.POINT_MASS:  # a 1 per position: exact
                assert torch.equal(got[i, :k], qlaw.probs(d, V))
            elif d is not None:
                torch.testing.assert_close(got[i, :k], qlaw.probs(d, V), rtol=2**-23, atol=0)
            assert not got[i, k:].any()
    assert not q.buf[1:].any()  # rows past the last (one-request) step hold nothing stale


def test_v1_asks_for_the_depth_the_policy_chooses_each_round(monkeypatch):
    """k cycling 3, 0, 1 by round: the PROPOSE items carry it, a k = 0 round sends nothing
    (target-only), q rows past k stay 0, and what was handed feeds the next choice."""
    from specpair.vllm.v1 import propose_remote

    monkeypatch.setenv("SPECPAIR_DEPTH_POLICY", "schedule:3,0,1")
    proposer = v1_proposer()
    proposer.drafting.source = FakeSource(["ok", "ok"])
    sp = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0, seed=5)
    table = np.arange(32, dtype=np.int32).reshape(1, 32) % V
    runner = SimpleNamespace(
        drafter=proposer, device=torch.device("cpu"),
        requests={"a": SimpleNamespace(sampling_params=sp)},
        input_batch=SimpleNamespace(req_ids=["a"], token_ids_cpu=table,
                                    num_tokens_no_spec=np.array([3])))
    got = []
    for n, sampled in ((3, [2]), (5, [3, 4]), (6, [5])):
        runner.input_batch.num_tokens_no_spec = np.array([n])
        got.append(propose_remote(runner, [sampled]))
        if got[-1][0]:
            assert (runner._draft_probs[0, len(got[-1][0]):] == 0).all()
    assert got == [[[0, 1, 2]], [[]], [[0]]]
    assert [[it.depth for it in b] for b in proposer.drafting.source.batches] == [[3], [1]]
    assert proposer.drafting.policy.chosen == [1, 1, 0, 1]


def test_v1_a_request_carrying_its_own_policy_gets_its_depth(monkeypatch, caplog):
    """vllm_xargs={"specpair_depth_policy": ...} reaches V1 as the sampling params'
    extra_args: "a" pinned to 1 draft and "b" off beside an engine pinned to K; "c"'s value
    does not parse: one warning, and the engine's K, without failing the step."""
    from specpair.vllm.v1 import propose_remote

    monkeypatch.setenv("SPECPAIR_DEPTH_POLICY", f"fixed:{K}")
    proposer = v1_proposer()
    proposer.drafting.source = FakeSource(["ok"])

    def req(extra):
        return SimpleNamespace(sampling_params=SimpleNamespace(
            temperature=1.0, top_k=0, top_p=1.0, seed=5, extra_args=extra))

    runner = SimpleNamespace(
        drafter=proposer, device=torch.device("cpu"),
        requests={"a": req({"specpair_depth_policy": "fixed:1"}),
                  "b": req({"specpair_depth_policy": "off"}),
                  "c": req({"specpair_depth_policy": "fixed:99"}), "d": req(None)},
        input_batch=SimpleNamespace(req_ids=["a", "b", "c", "d"],
                                    token_ids_cpu=np.zeros((4, 16), dtype=np.int32),
                                    num_tokens_no_spec=np.array([3, 3, 3, 3])))
    with caplog.at_level("WARNING", logger="specpair.vllm.depth_policy"):
        got = propose_remote(runner, [[1], [1], [1], [1]])
    assert [len(d) for d in got] == [1, 0, K, K]
    assert [it.depth for it in proposer.drafting.source.batches[0]] == [1, K, K]  # b sent nothing
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["request c"]


def test_v2_flags_the_drafts_past_the_depth_the_policy_chose(monkeypatch):
    """k cycling 2, 0 by round: num_valid says how many leading drafts carry q (the rest are
    invalid drafts: the target samples there), and a k = 0 round sends nothing."""
    monkeypatch.setenv("SPECPAIR_DEPTH_POLICY", "schedule:2,0")
    spec, states = v2_speculator()
    spec.drafting.source = FakeSource(["ok"])
    temp = torch.ones(4)
    batch = v2_batch(["x"], [1], [0, 1])
    for n, sampled, rejected, valid in ((3, 1, 0, 2), (5, 2, 1, 0)):
        states.total_len.gpu[1] = n
        drafts = spec.propose(batch, None, None, torch.zeros(6, 8), None,
                              torch.tensor([sampled]), torch.tensor([rejected]), None, None,
                              temp, torch.arange(4))
        assert spec.num_valid[1] == valid
        assert drafts[0, valid:].eq(0).all() and torch.isneginf(spec.draft_logits[1, valid:]).all()
    assert [[it.depth for it in b] for b in spec.drafting.source.batches] == [[2]]
    assert spec.drafting.policy.chosen == [1, 0, 1, 0]


def _observed_reproducible(drafting) -> dict[str, bool]:
    """Wrap the depth policy's observe: request id -> the reproducible flag it was given."""
    seen, observe = {}, drafting.policy.observe

    def record(req_id, num_sampled, pin=None, law=(False, False), reproducible=False):
        seen[req_id] = reproducible
        return observe(req_id, num_sampled, pin, law, reproducible)

    drafting.policy.observe = record
    return seen


def test_v1_and_v2_tell_the_policy_which_requests_their_users_seeded():
    """A seeded request's depths follow its own history only (depth_policy): V1 reads the
    seed from the sampling params; V2 from the sampler's seeds_set (patch 0002 hands the
    speculator the sampling states: V2 draws a seed for every other request itself)."""
    from specpair.vllm.v1 import propose_remote

    proposer = v1_proposer()
    proposer.drafting.source = FakeSource(["ok"])
    seen = _observed_reproducible(proposer.drafting)

    def req(seed):
        return SimpleNamespace(sampling_params=SimpleNamespace(temperature=1.0, top_k=0,
                                                               top_p=1.0, seed=seed))

    runner = SimpleNamespace(
        drafter=proposer, device=torch.device("cpu"),
        requests={"seeded": req(7), "unseeded": req(None)},
        input_batch=SimpleNamespace(req_ids=["seeded", "unseeded"],
                                    token_ids_cpu=np.zeros((2, 16), dtype=np.int32),
                                    num_tokens_no_spec=np.array([3, 3])))
    propose_remote(runner, [[1], [1]])
    assert seen == {"seeded": True, "unseeded": False}

    for states, expected in ((SimpleNamespace(seeds_set=np.array([False, True, False, False])),
                              {"x": False, "y": True}), (None, {"x": False, "y": False})):
        spec, rs = v2_speculator()
        spec.drafting.source = FakeSource(["ok"])
        spec.sampling_states = states
        seen = _observed_reproducible(spec.drafting)
        rs.total_len.gpu[:2] = 3
        spec.propose(v2_batch(["x", "y"], [0, 1], [0, 1, 2]), None, None, torch.zeros(6, 8),
                     None, torch.tensor([1, 1]), torch.tensor([0, 0]), None, None,
                     torch.ones(4), torch.arange(4))
        assert seen == expected
