"""The gates see the GPUs where the host has them: images/bin/image-gates.sh's detection (a stand-in
device root), the NVML gate run with what it found (it FAILS on a host with an NVIDIA device
when NVML finds no GPU, and skips, saying why, only where there is none), and the report that
names the case. The gate runs here in this venv, as the image's pytest would (no Docker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

NVML_GATE = "tests/gates/test_nvml_gate.py"


def _detect(root: Path) -> dict[str, str]:
    proc = subprocess.run([str(ROOT / "images" / "bin" / "image-gates.sh"), "--detect"],
                          env={**os.environ, "GATES_DEVICE_ROOT": str(root)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def _no_nvml_here() -> bool:
    from specpair.health.errors import CannotProbe
    from specpair.health.nvml import LiveNvml

    try:
        LiveNvml().close()
    except CannotProbe:
        return True
    return False


def _gate(tmp_path: Path, host_gpus: str) -> tuple[int, str]:
    """Run the NVML gate as the gate container would, with the runner's finding; JUnit path."""
    xml = tmp_path / "nvml.xml"
    empty = tmp_path / "container-root"  # the gate's own look finds nothing (no --gpus here)
    empty.mkdir(exist_ok=True)
    env = {**os.environ, "SPECPAIR_HOST_GPUS": host_gpus, "SPECPAIR_DEVICE_ROOT": str(empty),
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gate", NVML_GATE, "-q",
                           "-p", "no:cacheprovider", f"--junitxml={xml}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, str(xml)


@pytest.mark.parametrize("stand_in", ["dev/nvidia0", "proc/driver/nvidia"])
def test_the_detection_finds_a_stand_in_device(tmp_path, stand_in):
    (tmp_path / stand_in).parent.mkdir(parents=True)
    (tmp_path / stand_in).mkdir() if stand_in.endswith("nvidia") else (tmp_path / stand_in).touch()
    assert _detect(tmp_path) == {"SPECPAIR_HOST_GPUS": "/" + stand_in,
                                 "DOCKER_GPU_ARGS": "--gpus all"}


def test_no_device_no_gpus(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()  # control nodes alone are not a GPU
    assert _detect(tmp_path) == {"SPECPAIR_HOST_GPUS": "", "DOCKER_GPU_ARGS": ""}


def test_the_script_gives_the_container_the_gpus_and_the_finding():
    text = (ROOT / "images" / "bin" / "image-gates.sh").read_text()
    assert 'docker run --rm --network "$network" --user 0 "${gpu_args[@]}"' in text
    assert '-e SPECPAIR_HOST_GPUS="$gpus"' in text
    assert '--host-gpus "$gpus"' in text


@pytest.mark.skipif(not _no_nvml_here(), reason="NVML finds a GPU on this machine: the gate "
                    "would run for real, not fail for want of one")
def test_a_host_with_a_device_fails_the_nvml_gate_instead_of_skipping(tmp_path, gates_report):
    (tmp_path / "root" / "dev").mkdir(parents=True)
    (tmp_path / "root" / "dev" / "nvidia0").touch()
    found = _detect(tmp_path / "root")["SPECPAIR_HOST_GPUS"]
    rc, xml = _gate(tmp_path, found)
    assert rc == 1
    cases = gates_report.read_cases(xml)
    assert cases and all(c.outcome == "error" for c in cases), cases  # ran, failed in its fixture
    assert all("NVML found no GPU but the host has NVIDIA devices (/dev/nvidia0)" in c.message
               for c in cases), cases
    ok, reason = gates_report.verdict(cases, rc, None, host_gpus=found)
    assert not ok and "2 gate(s) failed" in reason
    assert "/dev/nvidia0" in gates_report.gpu_case(found)


@pytest.mark.skipif(not _no_nvml_here(), reason="NVML finds a GPU on this machine")
def test_a_host_without_a_device_skips_it_with_the_reason(tmp_path, gates_report):
    (tmp_path / "root").mkdir()
    found = _detect(tmp_path / "root")["SPECPAIR_HOST_GPUS"]
    assert found == ""
    rc, xml = _gate(tmp_path, found)
    cases = gates_report.read_cases(xml)
    assert rc == 0  # pytest passes a run whose tests all skipped: the report judges it
    assert cases and all(c.outcome == "skipped" for c in cases), cases
    assert all(c.message.startswith("no NVIDIA device on this host (no /dev/nvidia<N>, "
                                    "no /proc/driver/nvidia)") for c in cases), cases
    assert gates_report.gpu_case(found).startswith("host NVIDIA devices: none")


def test_a_skipped_nvml_gate_fails_the_report_where_the_host_has_devices(tmp_path, gates_report):
    xml = tmp_path / "g.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.gates.test_rng_gate" name="test_rng" time="1"/>'
                   '<testcase classname="tests.gates.test_nvml_gate" name="test_health" time="0">'
                   '<skipped message="no NVIDIA device on this host"/></testcase>'
                   '</testsuite></testsuites>')
    cases = gates_report.read_cases(str(xml))
    assert gates_report.verdict(cases, 0, None)[0]  # no device: the skip is honest
    ok, reason = gates_report.verdict(cases, 0, None, host_gpus="/dev/nvidia0")
    assert not ok and "NVML gate(s) skipped on a host with NVIDIA devices" in reason
