"""`specpair health`: exit codes, JSON output, pair qualification, and the live probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specpair.cli import main
from specpair.health.errors import CannotProbe
from specpair.health.nvml import LiveNvml

SNAPS = Path(__file__).parent / "snapshots"


def _snap(name: str) -> str:
    return str(SNAPS / f"{name}.json")


def _nvml_present() -> bool:
    try:
        LiveNvml().close()
    except CannotProbe:
        return False
    return True


def test_no_nvml_exits_3_with_one_line(capsys):
    if _nvml_present():
        pytest.skip("NVML works on this machine: the exit-3 path needs a host without it")
    out = subprocess.run([sys.executable, "-m", "specpair", "health"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 3
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specpair health: cannot probe: "), lines
    assert main(["health", "--json", "--watch", "0"]) == 3
    assert json.loads(capsys.readouterr().out)["status"] == "cannot_probe"


@pytest.mark.parametrize("name, code", [
    ("rtx3090_pair_healthy", 0), ("gb10_sparkhead_healthy", 0), ("fault_xid79", 1),
    ("fault_nvlink_down", 1), ("fault_thermal_throttle", 1), ("fault_row_remap_failure", 1),
])
def test_exit_codes_on_snapshots(name, code, capsys):
    assert main(["health", "--snapshot", _snap(name), "--json"]) == code
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == code
    assert out["status"] == {0: "pass", 1: "fail"}[code]


def test_warn_exits_2(tmp_path, capsys):
    snap = json.loads(Path(_snap("rtx3090_pair_healthy")).read_text())
    snap["calls"]["nvmlDeviceGetPowerUsage(0)"] = 345000  # 345 of 350 W
    path = tmp_path / "warn.json"
    path.write_text(json.dumps(snap))
    assert main(["health", "--snapshot", str(path)]) == 2
    assert "WARN  GPU 0 power: 345.0 W of a 350.0 W limit" in capsys.readouterr().out


def test_bad_inputs_exit_4(tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    bad.write_text("version: 2\n")
    assert main(["health", "--snapshot", _snap("fault_xid79"), "--policy", str(bad)]) == 4
    assert main(["health", "--snapshot", str(tmp_path / "missing.json")]) == 4
    assert main(["health", "--snapshot", _snap("fault_xid79"), "--watch", "-1"]) == 4
    with pytest.raises(SystemExit) as e:
        main(["health", "--watch", "soon"])
    assert e.value.code == 4
    assert "bad input" in capsys.readouterr().err


def test_qualify_drafter_pair_records_uuids(capsys):
    assert main(["health", "--qualify", "drafter-pair", "--snapshot",
                 _snap("rtx3090_pair_healthy"), "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["qualification"]
    assert q["qualified"] is True
    assert q["uuids"] == ["GPU-4f1c2a7e-9b3d-5e61-a0c8-2d7f1e9b6c34",
                          "GPU-b83e0d59-61fa-4c27-9e15-7a0c3d8f2b91"]
    assert {c["name"] for c in q["checks"]} >= {"same model", "all NVLinks up", "same driver",
                                                "P2P read GPU 0 -> GPU 1",
                                                "P2P write GPU 1 -> GPU 0"}


@pytest.mark.parametrize("edit, failing", [
    ({"nvmlDeviceGetNvLinkState(1,2)": 0}, "all NVLinks up"),
    ({"nvmlDeviceGetP2PStatus(1,0,0)": 2}, "P2P read GPU 1 -> GPU 0"),
    ({"nvmlDeviceGetP2PStatus(0,1,1)": {"nvml_error": 3}}, "P2P write GPU 0 -> GPU 1"),
    ({"nvmlDeviceGetName(1)": "NVIDIA GeForce RTX 3090 Ti"}, "same model"),
])
def test_drafter_pair_invariants(tmp_path, capsys, edit, failing):
    snap = json.loads(Path(_snap("rtx3090_pair_healthy")).read_text())
    snap["calls"].update(edit)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(snap))
    assert main(["health", "--qualify", "drafter-pair", "--input", str(path), "--json",
                 "--role", "x86host"]) == 1
    q = json.loads(capsys.readouterr().out)["qualification"]
    assert failing in [c["name"] for c in q["checks"] if not c["ok"]]


def test_qualify_target_pair_from_snapshot_and_json_report(tmp_path, capsys):
    assert main(["health", "--snapshot", _snap("gb10_sparkhead_healthy"), "--json"]) == 0
    head = tmp_path / "head.json"
    head.write_text(capsys.readouterr().out)
    assert main(["health", "--qualify", "target-pair", "--input", str(head), "--input",
                 _snap("gb10_sparkworker_healthy"), "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["qualification"]
    assert q["qualified"] and q["hosts"] == ["sparkhead", "sparkworker"]
    assert q["uuids"] == ["GPU-7a2d9c41-3e0b-5f18-8c6d-1b9e4f02a7d3",
                          "GPU-e05b83f6-92c4-5a7d-b1e3-6f48d20c9a15"]


def test_target_pair_needs_same_driver_and_two_distinct_healthy_gpus(tmp_path, capsys):
    worker = json.loads(Path(_snap("gb10_sparkworker_healthy")).read_text())
    worker["calls"]["nvmlSystemGetDriverVersion()"] = "580.82.09"
    path = tmp_path / "w.json"
    path.write_text(json.dumps(worker))
    head = _snap("gb10_sparkhead_healthy")
    assert main(["health", "--qualify", "target-pair", "--input", head, "--input", str(path),
                 "--json"]) == 1
    failed = [c["name"] for c in
              json.loads(capsys.readouterr().out)["qualification"]["checks"] if not c["ok"]]
    assert failed == ["same driver"]
    assert main(["health", "--qualify", "target-pair", "--input", head, "--input", head,
                 "--json"]) == 1
    failed = [c["name"] for c in
              json.loads(capsys.readouterr().out)["qualification"]["checks"] if not c["ok"]]
    assert failed == ["distinct GPUs"]
    assert main(["health", "--qualify", "target-pair", "--input", head, "--input",
                 _snap("fault_row_remap_failure"), "--json"]) == 1
    failed = [c["name"] for c in
              json.loads(capsys.readouterr().out)["qualification"]["checks"] if not c["ok"]]
    assert failed == ["distinct GPUs", "health not failing"]
    assert main(["health", "--qualify", "target-pair", "--input", head]) == 4


@pytest.mark.gpu
def test_live_probe_reads_every_gpu(tmp_path):
    """The real probe on this host's GPUs (skips only where NVML is absent)."""
    try:
        live = LiveNvml()
    except CannotProbe as e:
        pytest.skip(f"no NVML on this machine: {e}")
    from specpair.health.nvml import RecordedNvml, Recorder
    from specpair.health.probe import probe

    rec = Recorder(live, "live")
    try:
        report = probe(rec, "live", 1.0)
    finally:
        rec.close()
    assert report.gpus and all(str(g.identity.uuid).startswith("GPU-") for g in report.gpus)
    rec.write(tmp_path / "live.json")
    replayed = probe(RecordedNvml.load(tmp_path / "live.json"), "live", 1.0)
    assert replayed.gpus == report.gpus


def test_health_depends_on_deploy_one_way():
    """`health --inventory` runs deploy's playbook; deploy imports nothing of health (no cycle),
    and `python -m specpair health` loads no other command group (the playbooks' probe)."""
    code = ("import importlib, pkgutil, sys, specpair.deploy as d\n"
            "for m in pkgutil.iter_modules(d.__path__):\n"
            "    importlib.import_module(f'specpair.deploy.{m.name}')\n"
            "assert not [m for m in sys.modules if m.startswith('specpair.health')]\n"
            "from specpair.cli import build_parser\n"
            "build_parser('health')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
