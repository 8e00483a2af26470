"""The drafter engine in process: batching, cropping, resync, refusal, features."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from drafter_probe import ProbeModel, expected_first_draft

from specpair.draft import DraftMode
from specpair.drafter.engine import DrafterEngine
from specpair.drafter.model import HFDraftModel
from specpair.models.tiny import TinyPair
from specpair.proposal import QKind
from specpair.wire.frames import (
    DraftItem,
    ItemStatus,
    Propose,
    ProposeItem,
    RequestParams,
)

V = 512
FP = bytes(32)


def _item(rid: int, new: list[int], position: int, depth: int, params: RequestParams,
          num_accepted: int = 0, features: torch.Tensor | None = None) -> ProposeItem:
    return ProposeItem(request_id=rid, new_tokens=torch.tensor(new, dtype=torch.int64),
                       num_accepted=num_accepted, position=position, depth=depth,
                       params=params, features=features)


def _dense(item: DraftItem) -> torch.Tensor:
    """[K, V] float64 probabilities of the item's laws."""
    if item.kind == QKind.DENSE:
        return torch.softmax(item.q_logp.double(), dim=-1)
    out = torch.zeros(item.tokens.numel(), V, dtype=torch.float64)
    ids = item.q_ids
    p = torch.softmax(item.q_logp.double(), dim=-1)
    for k in range(ids.shape[0]):
        valid = ids[k] >= 0
        out[k, ids[k][valid]] = p[k][valid]
    return out


@pytest.fixture(scope="module")
def draft_model(tiny_pair: TinyPair) -> HFDraftModel:
    return HFDraftModel(tiny_pair.draft)


def test_batched_rounds_with_crops_match_a_fresh_single_request_draft(
        draft_model: HFDraftModel) -> None:
    """4 requests (mixed params and K) over 5 rounds with random acceptance, one
    contradicting the drafts: each answer equals a cache-free single-request draft,
    and every round costs exactly max(K) forwards (one per draft step)."""
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    fresh = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    calls = []
    forward = draft_model.forward  # counted: one call per model forward

    def counted(*args):
        calls.append(1)
        return forward(*args)

    draft_model.forward = counted
    rng = random.Random(0)
    # All rows truncated or greedy, so the batch and each single request use the same
    # q encoding (SPARSE): the core's inverse-CDF draw walks a SPARSE law in descending
    # probability and a DENSE one in vocabulary order, so a draw depends on the encoding.
    params = {1: RequestParams(1.0, 50, 1.0, 11), 2: RequestParams(0.8, 20, 1.0, 12),
              3: RequestParams(1.0, 0, 0.9, 13), 4: RequestParams(0.0, 0, 1.0, 14)}
    depth = {1: 3, 2: 4, 3: 2, 4: 3}
    hist = {r: [1] + [rng.randrange(10, V) for _ in range(rng.randrange(1, 9))] for r in params}
    new = {r: list(h) for r, h in hist.items()}
    acc = dict.fromkeys(params, 0)
    try:
        for rnd in range(5):
            items = tuple(_item(r, new[r], len(hist[r]), depth[r], params[r], acc[r])
                          for r in params)
            calls.clear()
            got = engine.handle(Propose(rnd, items))
            assert len(calls) == max(depth.values())
            assert [i.request_id for i in got.items] == list(params)
            for it in got.items:
                r = it.request_id
                assert it.status == ItemStatus.OK and it.tokens.numel() == depth[r]
                ref = fresh.handle(Propose(rnd, (_item(r, hist[r], len(hist[r]), depth[r],
                                                       params[r]),))).items[0]
                assert it.tokens.tolist() == ref.tokens.tolist()
                torch.testing.assert_close(_dense(it), _dense(ref), atol=1e-5, rtol=1e-4)
                if r == 4:  # temperature 0: the point mass at the argmax
                    assert bool((_dense(it).max(dim=1).values == 1).all())
                n = rng.randrange(0, depth[r] + 1)
                drafts = it.tokens.tolist()
                committed = drafts[:n] + [rng.randrange(10, V)]
                if rnd == 2 and r == 1:  # the target claims 2 accepted but commits others
                    n, committed = 2, [(drafts[0] + 1) % V, drafts[1], 7]
                acc[r], new[r] = n, committed
                hist[r] = hist[r] + committed
    finally:
        draft_model.forward = forward
    assert engine.metrics.disagreements == 1
    assert engine.metrics.rounds == 5 and engine.metrics.requests[ItemStatus.OK] == 20


def test_resync_release_and_refusal(draft_model: HFDraftModel) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1, max_depth=4)
    p = RequestParams(1.0, 0, 1.0, 5)
    # unknown request with a partial history: RESYNC; the whole history: OK
    assert engine.handle(Propose(0, (_item(9, [5, 6], 10, 3, p),))).items[0].status == \
        ItemStatus.RESYNC
    got = engine.handle(Propose(1, (_item(9, [1, 5, 6], 3, 3, p), _item(8, [1, 7], 2, 5, p),
                                    _item(7, [1, V], 2, 2, p))))
    assert [i.status for i in got.items] == [ItemStatus.OK, ItemStatus.REFUSED,
                                             ItemStatus.REFUSED]  # K 5 > 4; id V
    assert got.items[1].tokens.numel() == 0 and engine.live_requests() == 1
    # a gap in the history (position skips ahead): RESYNC, and the state is dropped
    assert engine.handle(Propose(2, (_item(9, [4], 9, 3, p),))).items[0].status == \
        ItemStatus.RESYNC
    assert engine.live_requests() == 0
    engine.handle(Propose(3, (_item(9, [1, 5, 6], 3, 3, p),)))
    engine.release([9, 12345])
    assert engine.live_requests() == 0
    assert engine.handle(Propose(4, (_item(9, [4], 4, 3, p),))).items[0].status == \
        ItemStatus.RESYNC
    text = engine.metrics.render()
    assert "specpair_drafter_rounds_total 5" in text
    assert 'specpair_drafter_requests_total{status="resync"} 3' in text
    assert 'specpair_drafter_requests_total{status="refused"} 2' in text
    assert 'specpair_drafter_round_seconds_bucket{le="+Inf"} 5' in text


def test_hello_declares_mode_encodings_and_limits(draft_model: HFDraftModel) -> None:
    sampled = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1,
                            draft_top_k=32).hello()
    assert sampled.q_encodings == (QKind.SPARSE, QKind.DENSE, QKind.POINT_MASS)
    assert sampled.max_support == 32
    assert sampled.vocab_size == V and sampled.features is None
    greedy = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1,
                           mode=DraftMode.GREEDY).hello()
    assert greedy.q_encodings == (QKind.POINT_MASS,) and greedy.max_support == V
    with pytest.raises(ValueError, match="max_depth"):
        DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1, max_depth=33)


def test_greedy_mode_sends_argmax_as_point_mass(draft_model: HFDraftModel) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1,
                           mode=DraftMode.GREEDY)
    hist = [1, 20, 30, 40]
    got = engine.handle(Propose(0, (_item(1, hist, 4, 3, RequestParams(1.0, 0, 1.0, 1)),)))
    it = got.items[0]
    assert it.kind == QKind.POINT_MASS and it.q_logp is None
    seq = list(hist)
    with torch.no_grad():
        for k in range(3):
            nxt = int(draft_model.model(torch.tensor([seq])).logits[0, -1].argmax())
            assert it.tokens[k] == nxt
            seq.append(nxt)


def test_a_sampled_engine_drafts_argmax_for_the_items_that_ask(draft_model) -> None:
    """One round, two requests asking greedy drafts beside two asking sampled ones: the
    greedy ones get a GREEDY engine's drafts (POINT_MASS), the sampled ones what they get in
    a round without the greedy ones (one batch per mode)."""
    params = [RequestParams(1.0, 0, 1.0, 11 + r) for r in range(4)]
    hists = [[1, 20 + r, 30, 40 + r] for r in range(4)]

    def items(ids, greedy=()):
        return tuple(replace(_item(r, hists[r], 4, 3, params[r]), greedy=r in greedy)
                     for r in ids)

    mixed = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1)
    got = {it.request_id: it for it in mixed.handle(Propose(0, items(range(4), {0, 2}))).items}
    greedy = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1,
                           mode=DraftMode.GREEDY).handle(Propose(0, items((0, 2)))).items
    sampled = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=1).handle(
        Propose(0, items((1, 3)))).items
    for it in greedy:
        assert got[it.request_id].kind == QKind.POINT_MASS
        assert torch.equal(got[it.request_id].tokens, it.tokens)
    for it in sampled:
        assert got[it.request_id].kind == it.kind != QKind.POINT_MASS
        assert torch.equal(got[it.request_id].tokens, it.tokens)
        assert torch.equal(got[it.request_id].q_logp, it.q_logp)


def test_top_k_wider_than_the_wire_support_limit_goes_dense() -> None:
    class Flat:  # uniform logits over 70,000 ids; its "cache" is the token count
        vocab_size, max_positions, feature_spec = 70_000, 4096, None

        def begin(self, rows):
            return self, torch.zeros(len(rows), self.vocab_size)

        def step(self, tokens):
            return torch.zeros(tokens.numel(), self.vocab_size)

        def finish(self):
            return [None]

        def crop(self, cache, length):
            return None

    engine = DrafterEngine(Flat(), tokenizer_fingerprint=FP, wire_version=1)
    assert engine.hello().max_support == 65_536
    it = engine.handle(Propose(0, (_item(1, [1, 2], 2, 2, RequestParams(1.0, 66_000, 1.0, 3)),))
                       ).items[0]
    assert it.kind == QKind.DENSE and it.q_logp.shape == (2, 70_000)
    assert int(torch.isfinite(it.q_logp).sum(dim=1).min()) == 66_000
    assert bool(torch.isfinite(it.q_logp[torch.arange(2), it.tokens]).all())


def test_context_features_arrive_aligned_to_their_positions() -> None:
    """Drafts of the probe model equal the position-weighted sum of the feature
    codes of the committed history, round after round, through rejections,
    contradicting commits and a whole-history resend."""
    width = 24
    engine = DrafterEngine(ProbeModel(V, width), tokenizer_fingerprint=FP, wire_version=1)
    assert engine.hello().features.width == width
    rng = random.Random(1)
    top1 = RequestParams(1.0, 1, 1.0, 3)

    def feats(codes: list[int]) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor(codes), width).float()

    codes = [rng.randrange(width) for _ in range(5)]
    hist_len, new_codes, acc = 5, list(codes), 0
    for rnd in range(6):
        n_new = len(new_codes)
        if rnd == 4:  # resend everything, as after a reconnect
            n_new, new_codes = hist_len, list(codes)
        toks = [rng.randrange(V) for _ in range(n_new)]
        it = engine.handle(Propose(rnd, (_item(1, toks, hist_len, 3, top1, acc,
                                                feats(new_codes)),))).items[0]
        assert it.status == ItemStatus.OK
        assert int(it.tokens[0]) == expected_first_draft(codes, V), rnd
        acc = rng.randrange(0, 4)
        new_codes = [rng.randrange(width) for _ in range(acc + 1)]
        codes += new_codes
        hist_len += acc + 1
    bad = _item(1, [3], hist_len, 3, top1, acc, torch.zeros(1, width + 1))
    assert engine.handle(Propose(9, (bad,))).items[0].status == ItemStatus.REFUSED
