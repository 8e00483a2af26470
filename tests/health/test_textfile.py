"""`specpair health --prometheus-file`: the node_exporter textfile on the recorded snapshots."""

from __future__ import annotations

import json
import re
import stat
import subprocess
from pathlib import Path

import pytest

from specpair.cli import main
from specpair.health.errors import CannotProbe
from specpair.health.nvml import LiveNvml
from specpair.health.textfile import VERDICTS, render, write

SNAPS = Path(__file__).parent / "snapshots"
_SAMPLE = re.compile(r'^([a-z_]+)(?:\{(.*)\})? (\S+)$')


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """{(name, frozenset of (label, value)): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, labels, value = _SAMPLE.match(line).groups()
        pairs = frozenset(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', labels or ""))
        out[(name, pairs)] = float(value)
    return out


def _probe(tmp_path: Path, snapshot: str, capsys) -> tuple[int, dict, dict]:
    prom = tmp_path / "specpair_health.prom"
    code = main(["health", "--snapshot", str(SNAPS / f"{snapshot}.json"), "--json",
                 "--prometheus-file", str(prom)])
    return code, json.loads(capsys.readouterr().out), parse(prom.read_text())


def _verdict(samples: dict) -> str:
    on = [dict(k[1])["verdict"] for k, v in samples.items()
          if k[0] == "specpair_health_verdict" and v == 1]
    assert len(on) == 1 and len([k for k in samples if k[0] == "specpair_health_verdict"]) == 4
    return on[0]


@pytest.mark.parametrize("name", sorted(p.stem for p in SNAPS.glob("*.json")))
def test_textfile_matches_the_verdict_on_every_snapshot(name: str, tmp_path: Path,
                                                        capsys) -> None:
    code, out, samples = _probe(tmp_path, name, capsys)
    assert _verdict(samples) == out["status"] and code == out["exit_code"]
    fails = sum(1 for f in out["findings"] if f["level"] == "fail")
    got = sum(v for k, v in samples.items()
              if k[0] == "specpair_health_findings" and dict(k[1])["level"] == "fail")
    assert got == fails
    events = out["report"]["xid"]["events"]
    xid = {k: v for k, v in samples.items() if k[0] == "specpair_health_xid_events"}
    assert sum(xid.values()) == len(events)
    assert samples[("specpair_health_gpus", frozenset())] == len(out["report"]["gpus"])
    info = next(dict(k[1]) for k in samples if k[0] == "specpair_health_info")
    assert info["profile"] == out["profile"] and info["driver"] == out["report"]["driver"]


def test_xid79_is_exported_with_its_gpu_and_policy_level(tmp_path: Path, capsys) -> None:
    code, _, samples = _probe(tmp_path, "fault_xid79", capsys)
    assert code == 1 and _verdict(samples) == "fail"
    xid = {k: v for k, v in samples.items() if k[0] == "specpair_health_xid_events"}
    assert xid == {("specpair_health_xid_events",
                    frozenset({("gpu", "1"), ("xid", "79"), ("level", "fail")})): 1.0}
    assert samples[("specpair_health_findings",
                    frozenset({("level", "fail"), ("check", "xid")}))] == 1
    assert samples[("specpair_health_xid_watch_seconds", frozenset())] == 5.0
    _, _, healthy = _probe(tmp_path, "rtx3090_pair_healthy", capsys)
    assert _verdict(healthy) == "pass"
    assert not any(k[0] == "specpair_health_xid_events" for k in healthy)


def test_cannot_probe_is_exported(tmp_path: Path, capsys) -> None:
    try:
        LiveNvml().close()
    except CannotProbe:  # no NVML here: the case under test
        pass
    else:
        pytest.skip("NVML works on this machine: the cannot-probe path needs a host without it")
    prom = tmp_path / "h.prom"
    assert main(["health", "--watch", "0", "--prometheus-file", str(prom)]) == 3
    samples = parse(prom.read_text())
    assert _verdict(samples) == "cannot_probe"
    assert {k[0] for k in samples} == {"specpair_health_verdict",
                                       "specpair_health_last_run_timestamp_seconds"}
    capsys.readouterr()


def test_the_file_is_replaced_atomically(tmp_path: Path) -> None:
    prom = tmp_path / "specpair_health.prom"
    prom.write_text("old\n")
    prom.chmod(0o600)
    write(prom, render("pass", now=1767225600.25))
    assert prom.read_text().endswith("specpair_health_last_run_timestamp_seconds "
                                     "1767225600.25\n")
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644  # node_exporter runs as another user
    assert [p.name for p in tmp_path.iterdir()] == [prom.name]  # no temporary left
    with pytest.raises(ValueError, match="verdict"):
        render("broken")
    assert VERDICTS == ("pass", "warn", "fail", "cannot_probe")


def test_refusals_exit_4(tmp_path: Path, capsys) -> None:
    snap = str(SNAPS / "rtx3090_pair_healthy.json")
    assert main(["health", "--snapshot", snap, "--qualify", "drafter-pair",
                 "--prometheus-file", str(tmp_path / "x.prom")]) == 4
    assert "--prometheus-file is for the probe of this host" in capsys.readouterr().err
    assert main(["health", "--snapshot", snap,
                 "--prometheus-file", str(tmp_path / "missing" / "x.prom")]) == 4
    assert "cannot write --prometheus-file" in capsys.readouterr().err
    assert not (tmp_path / "x.prom").exists()


def test_promtool_accepts_the_textfile(tmp_path: Path, capsys, promtool: str) -> None:
    for name in ("fault_xid79", "rtx3090_pair_healthy", "gb10_sparkhead_healthy"):
        _probe(tmp_path, name, capsys)
        text = (tmp_path / "specpair_health.prom").read_text()
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr
    out = subprocess.run([promtool, "check", "metrics"], input=render("cannot_probe"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
