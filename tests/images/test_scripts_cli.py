"""Bad input to the image scripts is refused up front, naming what was wrong (nothing is built)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / args[0]), *args[1:]], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("role", "profile"), [("target", "rtx3090"), ("drafter", "gb10"),
                                               ("verifier", "cpu")])
def test_image_build_refuses_an_unknown_role_profile_pair(role, profile):
    proc = _run("images/bin/image-build.sh", role, profile)
    assert proc.returncode == 2
    assert f"no image '{role}' for profile '{profile}'" in proc.stderr


def test_image_base_refuses_an_unknown_arch(tmp_path):
    proc = _run("images/bin/image-base.sh", "riscv64", str(tmp_path / "base.tar"))
    assert proc.returncode == 2
    assert "ARCH must be amd64 or arm64, got 'riscv64'" in proc.stderr
    assert not (tmp_path / "base.tar").exists()


def test_image_gates_refuses_a_bad_network(monkeypatch):
    monkeypatch.setenv("GATES_NETWORK", "bridge")
    proc = _run("images/bin/image-gates.sh", "specpair-target:cpu")
    assert proc.returncode == 2
    assert "GATES_NETWORK must be none or host" in proc.stderr


@pytest.mark.parametrize("tests",
                         ["../etc", "tests/gates/../../etc", "tests/unit", "tests/gates;id"])
def test_image_gates_refuses_test_paths_outside_the_gates(monkeypatch, tests):
    monkeypatch.setenv("GATES_TESTS", f"tests/gates/test_attestation_gate.py {tests}")
    proc = _run("images/bin/image-gates.sh", "specpair-target:cpu")
    assert proc.returncode == 2
    assert proc.stderr == f"error: GATES_TESTS: '{tests}' is not a path under tests/gates\n"


def test_local_pair_refuses_an_unknown_command():
    proc = _run("scripts/local-pair.sh", "sideways")
    assert proc.returncode == 2
    assert "unknown command 'sideways'" in proc.stderr


def test_image_lock_refuses_an_unknown_image():
    proc = subprocess.run([sys.executable, str(ROOT / "images" / "bin" / "image_lock.py"),
                           "--verify",
                           "tpu-target"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown image(s) ['tpu-target']" in proc.stderr


def test_disk_check_names_the_shortfall(tmp_path):
    proc = _run("scripts/disk-check.sh", "1000000", "the job", str(tmp_path / "not" / "yet"))
    assert proc.returncode == 1
    assert "the job needs about 1000000 GB free on the filesystem of" in proc.stderr
    assert f"{tmp_path}; it has " in proc.stderr  # the nearest existing parent, with its free GB


def test_disk_check_passes_what_fits(tmp_path):
    proc = _run("scripts/disk-check.sh", "0", "the job", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "GB free on the filesystem of" in proc.stdout
