"""The probe and the shipped policy on recorded NVML snapshots (tests/health/snapshots/).

The snapshots are synthetic recordings in the exact format `specpair health --record`
writes, modeled on real NVML answers (enum codes, NOT_SUPPORTED where those GPUs answer it).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specpair.health.codec import report_from_dict, to_dict
from specpair.health.errors import PolicyError, SnapshotError
from specpair.health.model import Failed, Skipped
from specpair.health.nvml import RecordedNvml, Recorder
from specpair.health.policy import evaluate, load_policy
from specpair.health.probe import probe

SNAPS = Path(__file__).parent / "snapshots"
POLICY = load_policy()


def _load(name: str) -> dict:
    return json.loads((SNAPS / f"{name}.json").read_text())


def _run(snapshot: dict, role: str | None = None):
    report = probe(RecordedNvml(snapshot), snapshot["host"], 5.0)
    return report, evaluate(report, POLICY, role)


def _active(assessment) -> list[tuple[str, str, str]]:
    return [(f.level, f.check, f.message) for f in assessment.findings
            if f.level in ("fail", "warn")]


# snapshot -> (status, profile, [(level, check, message substring)] exactly the fails/warns)
EXPECTED = {
    "rtx3090_pair_healthy": ("pass", "rtx3090", []),
    "gb10_sparkhead_healthy": ("pass", "gb10", []),
    "gb10_sparkworker_healthy": ("pass", "gb10", []),
    "fault_xid79": ("fail", "rtx3090", [("fail", "xid", "Xid 79")]),
    "fault_nvlink_down": ("fail", "rtx3090", [
        ("fail", "nvlink", "NVLink 2 is down"),
        ("fail", "nvlink", "3 NVLinks active; profile rtx3090 needs 4"),
        ("warn", "nvlink", "NVLink 2 replay errors = 37")]),
    "fault_thermal_throttle": ("fail", "rtx3090", [
        ("fail", "temperature", "GPU at 92 C"),
        ("fail", "throttle", "sw_thermal_slowdown, hw_thermal_slowdown")]),
    "fault_row_remap_failure": ("fail", "gb10", [
        ("fail", "row_remap", "row remapping FAILED"),
        ("warn", "row_remap", "rows remapped for uncorrectable errors = 3")]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdict_and_reasons_per_snapshot(name):
    status, profile, expected = EXPECTED[name]
    _, a = _run(_load(name))
    assert (a.status, a.profile) == (status, profile)
    got = _active(a)
    assert len(got) == len(expected), got
    for (level, check, text), (glevel, gcheck, gmsg) in zip(expected, got, strict=True):
        assert (level, check) == (glevel, gcheck) and text in gmsg, (level, check, text, got)


def test_fault_gpu_is_named():
    _, a = _run(_load("fault_xid79"))
    assert [f.gpu for f in a.findings if f.level == "fail"] == [1]


def test_not_supported_is_skipped_never_pass_or_fail():
    report, a = _run(_load("rtx3090_pair_healthy"))
    ecc = report.gpus[0].ecc
    assert all(isinstance(getattr(ecc, f), Skipped) for f in
               ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected",
                "aggregate_uncorrected"))
    assert isinstance(report.gpus[0].row_remap.failure, Skipped)
    assert isinstance(report.gpus[0].identity.serial, Skipped)
    levels = {f.level for f in a.findings if f.check in ("ecc", "row_remap", "retired_pages")}
    assert levels == {"skipped"}


def test_gb10_memory_comes_from_proc_meminfo_and_pcie_is_skipped():
    snap = _load("gb10_sparkhead_healthy")
    report, a = _run(snap)
    mem = report.gpus[0].memory
    assert mem.source == "/proc/meminfo"
    assert mem.total_bytes == snap["meminfo"]["MemTotal"]
    assert mem.available_bytes == snap["meminfo"]["MemAvailable"]
    assert report.gpus[0].identity.compute_capability == (12, 1)
    assert isinstance(report.gpus[0].pcie.width, Skipped)
    assert report.gpus[0].nvlinks == ()
    assert {f.level for f in a.findings if f.check in ("pcie", "nvlink")} == {"skipped"}


def test_rtx3090_identity_and_links():
    report, _ = _run(_load("rtx3090_pair_healthy"))
    assert [g.identity.compute_capability for g in report.gpus] == [(8, 6), (8, 6)]
    assert [len(g.nvlinks) for g in report.gpus] == [4, 4]
    assert report.gpus[0].memory.source == "nvml"
    assert len(report.p2p) == 2 and all(p.read == p.write == p.nvlink == 0 for p in report.p2p)


def test_other_nvml_errors_fail():
    snap = _load("rtx3090_pair_healthy")
    snap["calls"]["nvmlDeviceGetTemperature(1,0)"] = {"nvml_error": 15, "name": "GPU_IS_LOST"}
    report, a = _run(snap)
    assert isinstance(report.gpus[1].thermal.gpu_c, Failed)
    assert a.status == "fail"
    assert any("GPU_IS_LOST" in f.message and f.gpu == 1 for f in a.findings
               if f.level == "fail")


def test_warn_only_gives_warn():
    snap = _load("rtx3090_pair_healthy")
    snap["calls"]["nvmlDeviceGetTemperature(0,0)"] = 85  # warn 83, fail 90
    snap["calls"]["nvmlDeviceGetCurrPcieLinkWidth(1)"] = 8  # x8 of x16
    _, a = _run(snap)
    assert a.status == "warn"
    assert [(f.check, f.gpu) for f in a.findings if f.level == "warn"] == [
        ("temperature", 0), ("pcie", 1)]


def test_p2p_not_ok_fails_the_drafter_profile():
    snap = _load("rtx3090_pair_healthy")
    snap["calls"]["nvmlDeviceGetP2PStatus(0,1,1)"] = 5  # write: NVML_P2P_STATUS_NOT_SUPPORTED
    _, a = _run(snap)
    assert a.status == "fail"
    assert any("P2P write GPU 0 -> GPU 1: status 5" in f.message for f in a.findings)


def test_explicit_role_applies_its_profile():
    _, a = _run(_load("gb10_sparkhead_healthy"), role="x86host")
    assert a.profile == "rtx3090" and a.status == "fail"
    messages = " | ".join(f.message for f in a.findings if f.level == "fail")
    assert "1 GPUs; profile rtx3090 expects 2" in messages
    assert "sm_121" in messages and "no NVLink" in messages


def test_unknown_role_and_uninferable_profile_are_policy_errors():
    report, _ = _run(_load("gb10_sparkhead_healthy"))
    with pytest.raises(PolicyError, match="no role 'gpuhost'"):
        evaluate(report, POLICY, "gpuhost")
    snap = _load("gb10_sparkhead_healthy")
    snap["calls"]["nvmlDeviceGetName(0)"] = "NVIDIA H100 80GB HBM3"
    with pytest.raises(PolicyError, match="cannot infer the profile"):
        _run(snap)


def test_xid_without_watch_window_is_skipped():
    snap = _load("rtx3090_pair_healthy")
    snap["xid_watch"]["seconds"] = 0.0
    _, a = _run(snap)
    assert a.status == "pass"
    assert any(f.check == "xid" and f.level == "skipped" for f in a.findings)


def test_other_xid_warns():
    snap = _load("rtx3090_pair_healthy")
    snap["xid_watch"]["events"] = [{"gpu": 0, "event_type": 8, "xid": 13, "t_s": 0.5}]
    _, a = _run(snap)
    assert a.status == "warn"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_report_json_round_trip(name):
    report, _ = _run(_load(name))
    assert report_from_dict(json.loads(json.dumps(to_dict(report)))) == report


def test_recorder_writes_a_snapshot_that_replays_identically(tmp_path):
    snap = _load("fault_nvlink_down")
    rec = Recorder(RecordedNvml(snap), "x86host")
    first = probe(rec, "x86host", 5.0)
    rec.write(tmp_path / "rec.json")
    replayed = RecordedNvml.load(tmp_path / "rec.json")
    again = probe(replayed, "x86host", 5.0)
    assert to_dict(again)["gpus"] == to_dict(first)["gpus"]
    assert again.xid == first.xid
    assert replayed.snapshot["calls"] == snap["calls"]  # every query, errors included


def test_incomplete_or_foreign_snapshot_is_refused():
    snap = _load("rtx3090_pair_healthy")
    del snap["calls"]["nvmlDeviceGetUUID(1)"]
    with pytest.raises(SnapshotError, match=r"nvmlDeviceGetUUID\(1\)"):
        _run(snap)
    with pytest.raises(SnapshotError, match="not a specpair-nvml-snapshot/1"):
        RecordedNvml({"format": "other"})


def _write_policy(tmp_path: Path, mutate) -> Path:
    import yaml

    from specpair.health.policy import DEFAULT_POLICY

    raw = yaml.safe_load(DEFAULT_POLICY.read_text())
    mutate(raw)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["profiles"]["gb10"].pop("xid_fail"), "missing keys \\['xid_fail'\\]"),
    (lambda r: r["profiles"]["gb10"].update(xid_fatal=[79]), "unknown keys \\['xid_fatal'\\]"),
    (lambda r: r["profiles"]["gb10"].update(xid_other="maybe"), "xid_other must be one of"),
    (lambda r: r["profiles"]["gb10"].update(temperature_fail_c="hot"), "temperature_fail_c"),
    (lambda r: r["profiles"]["gb10"].update(clock_reasons_fail=["too_hot"]),
     "unknown clock reasons"),
    (lambda r: r["roles"].update(spare="a100"), "unknown profile 'a100'"),
])
def test_malformed_policy_is_refused_naming_the_key(tmp_path, mutate, message):
    with pytest.raises(PolicyError, match=message):
        load_policy(_write_policy(tmp_path, mutate))


def test_a_stricter_policy_changes_the_verdict(tmp_path):
    def stricter(raw):
        raw["profiles"]["rtx3090"]["pcie_gen_below_max"] = "warn"

    _, a = _run(_load("rtx3090_pair_healthy"))
    assert a.status == "pass"
    report = probe(RecordedNvml(copy.deepcopy(_load("rtx3090_pair_healthy"))), "x", 5.0)
    b = evaluate(report, load_policy(_write_policy(tmp_path, stricter)))
    assert b.status == "warn"
