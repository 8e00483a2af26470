"""The verifier-RNG gate, run at quick size in `make test` and full size in `make gates`.

Sample sizes: StressConfig.trials (quick in make test, full with SPECPAIR_GATE_SIZE=full).
Statistic: chi-square of emitted tokens per position vs the target law, and an exact
binomial test of acceptance vs sum(min(p, q)); threshold chi2.isf(alpha/m, df) with
alpha = 1e-6 over m checks, so a correct verifier fails with probability <= 1e-6.
The control (recovery coupled to the DRAFT stream) must fail.
"""

import json
import os

import pytest

from specpair.cli import main
from specpair.gates import rng_gate
from specpair.verify import VerifierStreams

SIZE = os.environ.get("SPECPAIR_GATE_SIZE", "quick")


@pytest.mark.gate
def test_rng_gate_passes_and_its_control_fails():
    report = rng_gate.run_gate(SIZE)
    failed = [c for c in report.checks if not c.passed]
    assert not failed, failed
    assert report.control_failed
    worst = max(c.chi2 / c.threshold for c in report.control if c.kind == "chi2")
    assert worst > 5, f"control chi2 only {worst:.1f}x its threshold"
    # the coupling bug leaves the acceptance rate alone: only the distribution moves
    assert all(c.passed for c in report.control if c.kind == "acceptance")
    assert report.status == "PASS"
    names = {c.config for c in report.checks}
    assert names == {c.name for c in rng_gate.CONFIGS}


def test_a_gate_whose_control_passes_reports_itself_broken(monkeypatch):
    monkeypatch.setattr(rng_gate, "COUPLED", VerifierStreams())  # the control without its bug
    report = rng_gate.run_gate("quick", ["anti8-k3-t1.0"])
    assert report.checks_passed
    assert not report.control_failed
    assert report.status == "BROKEN"


def test_cli_json_and_exit_code(capsys):
    code = main(["gate", "rng", "--json", "--size", "quick", "--config", "anti8-k3-t1.0"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "PASS" and out["control_failed"]
    check = out["checks"][0]
    for key in ("config", "n", "df", "chi2", "threshold", "acceptance"):
        assert key in check
    assert out["m"] == 7  # K = 3: 4 chi-square + 3 acceptance checks


def test_unknown_configuration_is_named():
    with pytest.raises(ValueError, match="nope"):
        rng_gate.run_gate("quick", ["nope"])
