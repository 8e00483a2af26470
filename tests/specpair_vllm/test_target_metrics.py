"""The target's specpair metrics (specpair.vllm.metrics) on a session over a scripted source,
and their way across processes (prometheus_client multiprocess mode, as vLLM's /metrics
reads it)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fake_source import PARAMS, FakeSource, K, V
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from specpair.vllm.metrics import ITEM_LABELS, TargetMetrics
from specpair.vllm.policy_setting import PolicySetting
from specpair.wire.session import DraftSession, StepRequest

LIVE = {"a", "b"}
SRC = Path(__file__).resolve().parents[2] / "src"
WIRE_TESTS = Path(__file__).resolve().parents[1] / "wire"  # fake_source


class Flaky(FakeSource):
    """FakeSource whose connection is down in the steps listed in ``down`` (0-based)."""

    def __init__(self, script, down=()):
        super().__init__(script)
        self.down, self.calls = set(down), 0

    def ensure_connected(self, timeout_s):
        self.calls += 1
        return None if self.calls - 1 in self.down else 1


def _step(s, m, reqs, live=LIVE):
    """One step the way an adapter drives it, then the export; ``reqs`` are (req id,
    committed tokens, tokens committed this step)."""
    s.begin(live)
    steps = []
    for rid, toks, sampled in reqs:
        start = s.needed_from(rid, len(toks))
        steps.append(StepRequest(rid, len(toks), torch.tensor(toks[start:], dtype=torch.int64),
                                 sampled, K, PARAMS))
    out = s.step(steps)
    m.publish(s)
    return out


def _metrics():
    reg = CollectorRegistry()
    m = TargetMetrics(reg)
    m.init_depth(K)
    return reg, m


def _v(reg, name, **labels):
    return reg.get_sample_value(name, labels)


def test_every_series_is_exported_at_zero_from_start():
    reg, _ = _metrics()
    assert _v(reg, "specpair_drafter_connected") == 0
    assert _v(reg, "specpair_rounds_total") == 0
    assert _v(reg, "specpair_drafts_dropped_at_verify_total") == 0
    assert _v(reg, "specpair_round_seconds_count") == 0
    for outcome, reason in ITEM_LABELS:
        assert _v(reg, "specpair_items_total", outcome=outcome, reason=reason) == 0
    for k in range(1, K + 1):
        for mode in ("greedy", "sampled"):
            assert _v(reg, "specpair_draft_tokens_total", position=str(k), mode=mode) == 0
            assert _v(reg, "specpair_accepted_drafts_total", position=str(k), mode=mode) == 0
    for k in range(K + 1):
        assert _v(reg, "specpair_chosen_depth_total", depth=str(k)) == 0
        assert _v(reg, "specpair_policy_tokens_per_second", depth=str(k)) == 0
        for part in ("round", "rest"):
            assert _v(reg, "specpair_policy_step_seconds", depth=str(k), part=part) == 0
    for k in range(1, K + 1):
        assert _v(reg, "specpair_policy_acceptance", position=str(k)) == 0
    assert _v(reg, "specpair_policy_acceptance", position="0") is None
    assert _v(reg, "specpair_policy_favoured_depth") == 0
    assert _v(reg, "specpair_policy_requests") == 0
    assert _v(reg, "specpair_policy_probe_rounds_total") == 0
    text = generate_latest(reg).decode()
    assert "# TYPE specpair_round_seconds histogram" in text
    assert "# TYPE specpair_drafter_connected gauge" in text
    assert "# TYPE specpair_policy_step_seconds gauge" in text


def test_items_by_outcome_rounds_and_round_time():
    reg, m = _metrics()
    s = DraftSession(FakeSource(["ok", "missing", "resync", "refused"]), V, 0.5)
    _step(s, m, [("a", [1, 2, 3], 1)])  # ok
    _step(s, m, [("a", [1, 2, 3, 0, 9], 2)])  # late: missing
    _step(s, m, [("a", [1, 2, 3, 0, 9, 4], 1)])  # resync
    _step(s, m, [("b", [5, 6], 1)])  # refused
    _step(s, m, [("b", [5, 6, 7], 1)])  # refused: not asked again, no round
    assert _v(reg, "specpair_rounds_total") == 4
    assert _v(reg, "specpair_items_total", outcome="ok", reason="none") == 1
    assert _v(reg, "specpair_items_total", outcome="missing", reason="late") == 1
    assert _v(reg, "specpair_items_total", outcome="resync", reason="none") == 1
    assert _v(reg, "specpair_items_total", outcome="refused", reason="refused") == 1
    assert _v(reg, "specpair_round_seconds_count") == 4
    assert _v(reg, "specpair_round_seconds_bucket", le="5.0") == 4
    assert _v(reg, "specpair_drafter_connected") == 1


def test_accepted_drafts_per_position_come_from_the_next_steps_num_sampled():
    reg, m = _metrics()
    s = DraftSession(FakeSource(["ok"] * 4), V, 0.5)
    _step(s, m, [("a", [1, 2, 3], 1), ("b", [7], 1)])  # 3 drafts each
    # a: 2 of its 3 drafts accepted (+ 1 target token); b: none accepted
    _step(s, m, [("a", [1, 2, 3, 0, 1, 9], 3), ("b", [7, 4], 1)])
    # a: all 3 accepted (+ bonus); b: 1 accepted
    _step(s, m, [("a", [1, 2, 3, 0, 1, 9, 0, 1, 2, 5], 4), ("b", [7, 4, 0, 8], 2)])
    acc = [_v(reg, "specpair_accepted_drafts_total", position=str(k), mode="sampled")
           for k in (1, 2, 3)]
    assert acc == [3, 2, 1]
    drafts = [_v(reg, "specpair_draft_tokens_total", position=str(k), mode="sampled")
              for k in (1, 2, 3)]
    assert drafts == [6, 6, 6]  # 3 steps x 2 requests, every position
    assert _v(reg, "specpair_accepted_drafts_total", position="1", mode="greedy") == 0
    assert s.counters.accepted_by == {"sampled": [3, 2, 1]}
    assert s.counters.draft_tokens_by == {"sampled": [6, 6, 6]}
    json.dumps(dataclasses.asdict(s.counters))  # the e2e probe reports the counters as JSON


def test_disconnected_interval_gauge_and_missing_by_reason():
    reg, m = _metrics()
    s = DraftSession(Flaky(["ok", "ok"], down=(1, 2)), V, 0.5)
    _step(s, m, [("a", [1, 2, 3], 1)])
    assert _v(reg, "specpair_drafter_connected") == 1
    _step(s, m, [("a", [1, 2, 3, 0], 1)])  # the drafter is gone
    assert _v(reg, "specpair_drafter_connected") == 0
    _step(s, m, [("a", [1, 2, 3, 0, 4], 1)])
    assert _v(reg, "specpair_drafter_connected") == 0
    assert _v(reg, "specpair_items_total", outcome="missing", reason="disconnected") == 2
    assert _v(reg, "specpair_round_seconds_count") == 1  # no round was sent while down
    _step(s, m, [("a", [1, 2, 3, 0, 4, 5], 1)])  # reconnected: the whole history again
    assert _v(reg, "specpair_drafter_connected") == 1
    assert _v(reg, "specpair_items_total", outcome="ok", reason="none") == 2
    assert _v(reg, "specpair_rounds_total") == 4


def test_a_dropped_connection_reads_disconnected_at_once():
    reg, m = _metrics()
    s = DraftSession(FakeSource(["raise"]), V, 0.5)  # the socket fails during the round
    _step(s, m, [("a", [1, 2, 3], 1)])
    assert _v(reg, "specpair_drafter_connected") == 0
    assert _v(reg, "specpair_items_total", outcome="missing", reason="disconnected") == 1


def test_the_series_reach_another_processes_registry(tmp_path):
    """vLLM's API server reads every process's values from PROMETHEUS_MULTIPROC_DIR
    (vllm/v1/metrics/prometheus.py): a session in a child process (as in the engine
    core) shows on a MultiProcessCollector here (as on vLLM's /metrics)."""
    mp = tmp_path / "prom"
    mp.mkdir()
    child = textwrap.dedent("""
        import torch
        from fake_source import PARAMS, FakeSource, K, V
        from specpair.vllm.metrics import target_metrics
        from specpair.wire.session import DraftSession, StepRequest
        from specpair.vllm.depth_policy import DepthPolicy
        m = target_metrics(K)
        s = DraftSession(FakeSource(["ok", "missing"]), V, 0.5)
        p = DepthPolicy(K, clock=iter(range(100)).__next__)
        for toks, sampled in (([1, 2, 3], 1), ([1, 2, 3, 0, 1], 2)):
            s.begin({"a"})
            p.begin({"a"})
            p.observe("a", sampled)
            p.handed("a", p.depths()["a"])
            start = s.needed_from("a", len(toks))
            s.step([StepRequest("a", len(toks), torch.tensor(toks[start:]), sampled, K,
                                PARAMS)])
            p.round_time(s.last_round_s)
            m.publish(s, p)
        for _ in range(3):  # the policy's steps go on (1 s each), with no round sent
            s.begin({"a"})
            p.begin({"a"})
            p.observe("a", 1)
            p.handed("a", p.depths()["a"])
            p.round_time(None)
            m.publish(s, p)
        m.dropped_at_verify()
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp),
           "PYTHONPATH": os.pathsep.join([str(SRC), str(WIRE_TESTS)])}
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=120)
    reg = CollectorRegistry()
    MultiProcessCollector(reg, path=str(mp))
    assert _v(reg, "specpair_rounds_total") == 2
    assert _v(reg, "specpair_items_total", outcome="ok", reason="none") == 1
    assert _v(reg, "specpair_items_total", outcome="missing", reason="late") == 1
    assert _v(reg, "specpair_items_total", outcome="missing", reason="peer_error") == 0
    assert _v(reg, "specpair_accepted_drafts_total", position="1", mode="sampled") == 1
    assert _v(reg, "specpair_accepted_drafts_total", position="2", mode="sampled") == 0
    assert _v(reg, "specpair_draft_tokens_total", position="3", mode="greedy") == 0
    assert _v(reg, "specpair_drafts_dropped_at_verify_total") == 1
    assert _v(reg, "specpair_round_seconds_count") == 2
    assert _v(reg, "specpair_drafter_connected") == 1
    # the policy's gauges too (a clock of 1 s a step: steps timed at 1 s)
    assert _v(reg, "specpair_chosen_depth_total", depth=str(K)) == 5
    assert _v(reg, "specpair_policy_requests") == 1
    assert _v(reg, "specpair_policy_favoured_depth") == K
    assert _v(reg, "specpair_policy_step_seconds", depth="0", part="rest") == pytest.approx(
        1.0, rel=0.01)
    assert 0 < _v(reg, "specpair_policy_acceptance", position="1") < 1
    assert _v(reg, "specpair_policy_tokens_per_second", depth=str(K)) > 1
    assert _v(reg, "specpair_policy_probe_rounds_total") == 0


def _proposer():
    from types import SimpleNamespace

    from specpair.vllm.v1 import RemoteProposer

    model = SimpleNamespace(get_vocab_size=lambda: V, max_model_len=64, tokenizer="unused")
    return RemoteProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K), model_config=model,
        scheduler_config=SimpleNamespace(max_num_seqs=4)))


def test_the_proposer_connects_at_engine_start_so_the_gauge_reads_the_truth(monkeypatch):
    from prometheus_client import REGISTRY

    import specpair.vllm.drafting as vdrafting

    monkeypatch.setenv("SPECPAIR_DRAFTER", "127.0.0.1:9")
    monkeypatch.setenv("SPECPAIR_DRAFTER_KEY_FILE", "/nonexistent")  # settings checked first
    monkeypatch.setattr(vdrafting, "make_source", lambda *a: Flaky([]))
    proposer = _proposer()
    assert proposer.drafting.remote is not None and proposer.drafting.remote.connected
    assert REGISTRY.get_sample_value("specpair_drafter_connected") == 1
    assert REGISTRY.get_sample_value("specpair_items_total",
                                     {"outcome": "missing", "reason": "late"}) is not None

    monkeypatch.setattr(vdrafting, "make_source", lambda *a: Flaky([], down=(0,)))
    assert not _proposer().drafting.remote.connected  # the drafter is not up yet
    assert REGISTRY.get_sample_value("specpair_drafter_connected") == 0

    def broken(*a):
        raise OSError("cannot read the key file")  # sound settings, a source that fails

    monkeypatch.setattr(vdrafting, "make_source", broken)
    proposer = _proposer()  # never raises at construction: the first step tries again
    assert proposer.drafting.source is None and proposer.drafting.remote is None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _policy_steps(policy, publish, steps, accepted, live=("a",)):
    """``steps`` decode steps of ``live``'s requests through ``policy`` (40 ms a step, 6 ms
    its round), ``accepted(step)`` drafts accepted of those handed; ``publish()`` after each."""
    sampled = dict.fromkeys(live, 1)
    for step in range(steps):
        policy.clock.now += 0.046
        policy.begin(set(live))
        for r in live:
            policy.observe(r, sampled[r])
        depths = policy.depths()
        for r, k in depths.items():
            policy.handed(r, k)
            sampled[r] = 1 + min(k, accepted(step))
        policy.round_time(0.006 if max(depths.values()) else None)
        publish()


def test_the_policys_estimates_are_gauges_so_its_choice_can_be_read():
    """After each adaptive step the gauges hold what it chose from: per depth the step time
    (round and rest) and the expected tokens per second, the largest of which it favours;
    per position the estimated acceptance; the requests they are for; probes counted."""
    from specpair.vllm.depth_policy import DepthPolicy

    reg, m = _metrics()
    policy = DepthPolicy(K, clock=_Clock())
    session = DraftSession(FakeSource([]), V, 0.5)
    _policy_steps(policy, lambda: m.publish(session, policy), 60, lambda step: 0)
    e = policy.estimates
    rates = [_v(reg, "specpair_policy_tokens_per_second", depth=str(k)) for k in range(K + 1)]
    assert rates == pytest.approx(list(e.rates)) and rates[0] > 0
    favoured = _v(reg, "specpair_policy_favoured_depth")
    assert favoured == e.favoured == max(range(K + 1), key=lambda k: (rates[k], -k)) == 0
    rest = [_v(reg, "specpair_policy_step_seconds", depth=str(k), part="rest")
            for k in range(K + 1)]
    rnd = [_v(reg, "specpair_policy_step_seconds", depth=str(k), part="round")
           for k in range(K + 1)]
    assert rest[0] == pytest.approx(0.046, rel=0.1) and rnd[0] == 0
    assert rnd[K] == pytest.approx(0.006, rel=0.2)
    assert [rest[k] + rnd[k] for k in range(K + 1)] == pytest.approx(
        [policy.time(k) for k in range(K + 1)])
    accept = [_v(reg, "specpair_policy_acceptance", position=str(k)) for k in range(1, K + 1)]
    assert accept == pytest.approx(list(e.accept)) and accept[0] < 0.5  # nothing accepted
    assert _v(reg, "specpair_policy_requests") == 1
    assert _v(reg, "specpair_policy_probe_rounds_total") == policy.probe_rounds > 0
    # a pinned engine makes no adaptive step: the gauges keep the last adaptive one's
    pinned = DepthPolicy(K, PolicySetting("fixed"), clock=_Clock())
    m.publish(session, pinned)
    assert _v(reg, "specpair_policy_favoured_depth") == 0
    assert _v(reg, "specpair_policy_requests") == 1
