"""Replay metadata and arguments outside the sampling domain: temperature
1e-45 exited 0 with an all-NaN report, 1e308 and top_k = 2**70 printed tracebacks. The domain
is specpair.sampling.check_params_domain (docs/core.md); replay refuses the rest with exit 4
and one line naming the parameter."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specpair.cli import main
from specpair.errors import EXIT_BAD_INPUT, BadSamplingParams
from specpair.replay.format import FORMAT
from specpair.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, check_params_domain


def _recording(path, temperature: str = "1.0", top_k: str = "0", top_p: str = "1.0"):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(8, 3, 64, generator=g)  # 100000 trials x 3 x 64 > 2^24 logits
    save_file({"target_logits": t, "draft_logits": t[:, :2] + 0.1}, str(path),
              metadata={"format": FORMAT, "temperature": temperature, "top_k": top_k,
                        "top_p": top_p})
    return str(path)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("meta", "what"), [
    ({"temperature": "1e-45"}, "temperature 1e-45 must be 0 (greedy) or lie in [1e-05, 100]"),
    ({"temperature": "1e-40"}, "temperature 1e-40"),
    ({"temperature": "1e308"}, "temperature 1e+308"),
    ({"temperature": "nan"}, "temperature nan"),
    ({"temperature": "-1"}, "temperature -1.0"),
    ({"temperature": "0"}, "temperature must be > 0"),
    ({"top_k": str(2**70)}, f"top_k {2**70} must be an integer in 0..2^63 - 1"),
    ({"top_k": "-1"}, "top_k -1"),
    ({"top_p": "1e-50"}, "top_p 1e-50 must lie in (0, 1] (1 = off) and be > 0 in fp32"),
    ({"top_p": "nan"}, "top_p nan"),
    ({"top_p": "1.5"}, "top_p 1.5"),
])
def test_out_of_domain_metadata_is_refused(tmp_path, capsys, meta, what):
    path = _recording(tmp_path / "r.safetensors", **meta)
    assert main(["replay", path, "--bootstrap", "100"]) == EXIT_BAD_INPUT
    assert what in _one_line_error(capsys)


def test_the_edges_of_the_domain_replay_to_finite_figures(tmp_path, capsys):
    for t in (MIN_TEMPERATURE, MAX_TEMPERATURE):
        path = _recording(tmp_path / "r.safetensors", temperature=repr(t), top_k=str(2**62),
                          top_p="1e-30")
        assert main(["replay", path, "--bootstrap", "100", "--json"]) == 0
        out = capsys.readouterr().out
        assert "NaN" not in out and "Infinity" not in out


@pytest.mark.parametrize(("args", "what"), [
    (["--bootstrap", str(2**70)], "--bootstrap must lie in 100..100000"),
    (["--bootstrap", "-1"], "--bootstrap must lie in"),
    (["--seed", "-1"], "--seed must lie in 0..4294967295"),
    (["--seed", str(2**70)], "--seed must lie in"),
    (["--monte-carlo", str(2**70)], "--monte-carlo must lie in 0..100000"),
    (["--monte-carlo", "100000"], "exceed 16777216 logits per round"),
    (["--depth", "0"], "--depth must lie in 1.."),
    (["--depth", str(2**70)], "depth must be in 1..2 (the recorded depth)"),
    (["--temperature", "1e308"], "temperature 1e+308"),
    (["--temperature", "nan"], "temperature nan"),
    (["--top-k", str(2**70)], "top_k"),
    (["--top-p", "0"], "top_p 0.0"),
    (["--prompts", "0"], "--prompts must lie in 1..4096"),
    (["--tokens", str(2**70)], "--tokens must lie in 1..8192"),
])
def test_out_of_range_arguments_are_refused(tmp_path, capsys, args, what):
    path = _recording(tmp_path / "r.safetensors")
    assert main(["replay", path, *args]) == EXIT_BAD_INPUT
    assert what in _one_line_error(capsys)


@pytest.mark.parametrize(("params", "ok"), [
    ((0.0, 0, 1.0), True), ((1e-5, 0, 1.0), True), ((100.0, 2**63 - 1, 1e-30), True),
    ((9.9e-6, 0, 1.0), False), ((100.001, 0, 1.0), False), ((float("inf"), 0, 1.0), False),
    ((1.0, 2**63, 1.0), False), ((1.0, 1.0, 1.0), False), ((1.0, True, 1.0), False),
    ((1.0, 0, 0.0), False), ((1.0, 0, 1e-46), False), ((1.0, 0, float("nan")), False),
])
def test_check_params_domain(params, ok):
    if ok:
        check_params_domain(*params)
    else:
        with pytest.raises(BadSamplingParams):
            check_params_domain(*params)
