"""Offline replay: exact expectations, agreement with the core's propose/verify, bootstrap,
file format, CLI and plot.

Monte Carlo agreement: the Monte Carlo mean over R rounds x T trials must lie within
4.4 standard errors of the closed form (two-sided false-failure rate ~1e-5; seeded, so the
test is deterministic).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from specpair.cli import main
from specpair.draft import DraftMode
from specpair.replay.compute import acceptance, expected_accepted, monte_carlo, replay
from specpair.replay.format import Recording, ReplayFormatError, load_recording, save_recording

Z = 4.4


def synthetic(rounds: int, depth: int, vocab: int, draft_noise: float, seed: int = 0,
              draft_scale: float = 1.0, temperature: float = 1.0) -> Recording:
    """Target logits ~ N(0, 2.5^2); draft = scale * (target + noise) at the draft positions."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rounds, depth + 1, vocab, generator=g) * 2.5
    d = draft_scale * (t[:, :depth] + torch.randn(rounds, depth, vocab, generator=g)
                       * draft_noise)
    return Recording(t, d, temperature, 0, 1.0)


def test_closed_form_on_a_two_token_law():
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.4, 0.6])
    rec = Recording(p.log().expand(1, 3, 2).clone(), q.log().expand(1, 2, 2).clone(), 1.0, 0,
                    1.0)
    greedy, sampled = acceptance(rec, 2)
    assert torch.allclose(sampled, torch.tensor([[0.7, 0.7]], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(greedy, torch.tensor([[0.3, 0.3]], dtype=torch.float64), atol=1e-6)
    assert math.isclose(float(expected_accepted(sampled)[0]), 0.7 + 0.49, abs_tol=1e-6)
    assert math.isclose(float(expected_accepted(greedy)[0]), 0.3 + 0.09, abs_tol=1e-6)


def test_a_drafters_top_k_truncates_q_only():
    """With the drafter's own top k, sampled acceptance is sum min(p, q_k), q_k its top k
    renormalized, p untouched: by hand on a three-token law; top 1 is the argmax's point
    mass, so it accepts exactly as greedy drafting does; k at or above V changes nothing."""
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    rec = Recording(p.log().expand(1, 2, 3).clone(), q.log().expand(1, 1, 3).clone(), 1.0, 0,
                    1.0)
    _, whole = acceptance(rec, 1)
    _, top2 = acceptance(rec, 1, draft_top_k=2)  # q_2 = (0, 0.625, 0.375)
    assert math.isclose(float(whole), 0.2 + 0.3 + 0.2, abs_tol=1e-6)
    assert math.isclose(float(top2), 0.0 + 0.3 + 0.2, abs_tol=1e-6)
    rec = synthetic(rounds=20, depth=3, vocab=32, draft_noise=1.0, seed=8)
    greedy, untruncated = acceptance(rec, 3)
    assert torch.allclose(acceptance(rec, 3, draft_top_k=1)[1], greedy, atol=1e-6)
    assert torch.equal(acceptance(rec, 3, draft_top_k=32)[1], untruncated)
    assert torch.equal(acceptance(rec, 3, draft_top_k=8)[0], greedy)  # greedy's q: argmax


@pytest.mark.parametrize("mode", [DraftMode.SAMPLED, DraftMode.GREEDY])
def test_monte_carlo_matches_sum_min_p_q_at_one_position(mode):
    """Depth 1: each trial accepts with probability a_r (sum min(p, q), or p(argmax q))."""
    rec = synthetic(rounds=40, depth=1, vocab=32, draft_noise=1.0, seed=1)
    trials = 400
    greedy, sampled = acceptance(rec, 1)
    a = (sampled if mode == DraftMode.SAMPLED else greedy)[:, 0]
    mc = monte_carlo(rec, 1, mode, trials, seed=5)
    se = math.sqrt(float((a * (1 - a)).sum()) / trials) / rec.rounds
    assert abs(float(mc.mean()) - float(a.mean())) <= Z * se, (float(mc.mean()), float(a.mean()))


def test_monte_carlo_matches_the_closed_form_over_a_round():
    """Depth 3: accepted per round from propose/verify vs sum_k prod_{j<=k} a_j."""
    rec = synthetic(rounds=48, depth=3, vocab=32, draft_noise=0.8, seed=2)
    exact = replay(rec, bootstrap=500)
    mc = replay(rec, bootstrap=500, trials=250, seed=3)
    assert mc.method == "monte-carlo" and exact.method == "exact"
    laws = dict(zip(("greedy", "sampled"), acceptance(rec, 3), strict=True))
    for name, mode in (("sampled", DraftMode.SAMPLED), ("greedy", DraftMode.GREEDY)):
        noise = monte_carlo(rec, 3, mode, 250, seed=3) - expected_accepted(laws[name])
        se = float(noise.std()) / math.sqrt(rec.rounds)  # per-round MC noise is independent
        assert math.isclose(getattr(mc.accepted, name) - getattr(exact.accepted, name),
                            float(noise.mean()), abs_tol=1e-9)
        assert abs(float(noise.mean())) <= Z * se, (name, float(noise.mean()), se)


def test_sampled_beats_greedy_when_q_is_close_to_p():
    r = replay(synthetic(rounds=200, depth=4, vocab=64, draft_noise=0.3, seed=4),
               bootstrap=2000)
    assert r.accepted.sampled > r.accepted.greedy
    assert r.accepted.diff_ci[0] > 0 and r.committed.rel_ci_pct[0] > 0
    assert math.isclose(r.committed.diff, r.accepted.diff, rel_tol=1e-12)
    assert math.isclose(r.committed.greedy, 1 + r.accepted.greedy, rel_tol=1e-12)


def test_greedy_beats_sampled_when_q_is_flat_around_the_same_argmax():
    """The control: a peaked target and a nearly flat draft with the same ranking: greedy
    keeps p(argmax p), sampling spreads its drafts and loses mass in sum min(p, q)."""
    r = replay(synthetic(rounds=200, depth=4, vocab=64, draft_noise=0.0, seed=4,
                         draft_scale=0.05, temperature=0.5), bootstrap=2000)
    assert r.accepted.greedy > r.accepted.sampled and r.accepted.diff_ci[1] < 0


def test_bootstrap_is_seeded():
    rec = synthetic(rounds=50, depth=2, vocab=16, draft_noise=0.5, seed=6)
    a, b, c = (replay(rec, bootstrap=500, seed=s) for s in (11, 11, 12))
    assert a == b
    assert a.accepted.diff_ci != c.accepted.diff_ci
    assert a.accepted.diff_ci[0] <= a.accepted.diff <= a.accepted.diff_ci[1]


def test_fixed_depth_below_the_recorded_one():
    rec = synthetic(rounds=10, depth=4, vocab=16, draft_noise=0.5, seed=7)
    _, s = acceptance(rec, 4)
    r = replay(rec, depth=2, bootstrap=200)
    want = float((s[:, 0] + s[:, 0] * s[:, 1]).mean())
    assert r.depth == 2 and math.isclose(r.accepted.sampled, want, rel_tol=1e-9)
    with pytest.raises(ValueError, match="depth must be in 1..4"):
        replay(rec, depth=5)


def test_file_round_trip_and_refusals(tmp_path):
    rec = synthetic(rounds=3, depth=2, vocab=8, draft_noise=0.5)
    path = tmp_path / "r.safetensors"
    save_recording(path, rec)
    back = load_recording(path)
    assert torch.equal(back.target_logits, rec.target_logits) and back.temperature == 1.0
    with pytest.raises(ReplayFormatError, match="does not match"):
        save_recording(path, Recording(rec.target_logits[:, :2], rec.draft_logits, 1.0, 0, 1.0))
    with pytest.raises(ReplayFormatError, match="temperature must be > 0"):
        save_recording(path, Recording(rec.target_logits, rec.draft_logits, 0.0, 0, 1.0))
    nan = rec.draft_logits.clone()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(ReplayFormatError, match="NaN"):
        save_recording(path, Recording(rec.target_logits, nan, 1.0, 0, 1.0))
    from safetensors.torch import save_file

    save_file({"target_logits": rec.target_logits, "draft_logits": rec.draft_logits},
              str(tmp_path / "nometa.safetensors"))
    with pytest.raises(ReplayFormatError, match="metadata format"):
        load_recording(tmp_path / "nometa.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ReplayFormatError, match="cannot read"):
        load_recording(tmp_path / "junk.safetensors")


def test_cli_table_json_and_plot(tmp_path, capsys):
    path = tmp_path / "r.safetensors"
    save_recording(path, synthetic(rounds=30, depth=3, vocab=32, draft_noise=0.4, seed=8))
    png = tmp_path / "acc.png"
    assert main(["replay", str(path), "--bootstrap", "500", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "accepted drafts" in out and "committed tokens" in out and "95% bootstrap" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert main(["replay", str(path), "--bootstrap", "500", "--json", "--depth", "2"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["depth"] == 2 and len(res["reach_sampled"]) == 2
    assert set(res["accepted"]) == {"greedy", "sampled", "diff", "diff_ci", "rel_pct",
                                    "rel_ci_pct"}
    assert main(["replay", str(tmp_path / "missing.safetensors")]) == 4
    assert main(["replay", str(path), "--depth", "9"]) == 4
