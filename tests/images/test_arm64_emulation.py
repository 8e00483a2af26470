"""images/bin/arm64-emulation.sh: nothing on arm64; elsewhere qemu set up or the missing piece named
in one line. Runs with stand-in tools on PATH and a stand-in binfmt_misc directory: nothing on
this machine is installed, mounted or enabled by these tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

SCRIPT = ROOT / "images" / "bin" / "arm64-emulation.sh"


def _tools(tmp_path: Path, uid: int = 0, **fakes: str) -> Path:
    """A PATH directory with the real basics, a stand-in `id -u` and the given stand-in tools."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    for tool in ("bash", "head", "grep", "dpkg", "uname", "touch"):
        real = shutil.which(tool)
        if real:
            (bin_ / tool).symlink_to(real)
    fakes = {"id": f"echo {uid}", **fakes}
    for name, body in fakes.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    return bin_


def _run(tmp_path: Path, bin_: Path, *args: str,
         arch: str = "amd64") -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_), "ARM64_EMU_ARCH": arch,
           "ARM64_EMU_BINFMT": str(tmp_path / "binfmt_misc")}
    return subprocess.run([shutil.which("bash"), str(SCRIPT), *args], env=env,
                          capture_output=True, text=True, timeout=30)


def _binfmt(tmp_path: Path, *, mounted: bool, enabled: bool | None) -> Path:
    d = tmp_path / "binfmt_misc"
    d.mkdir(exist_ok=True)
    if mounted:
        (d / "register").write_text("")
    if enabled is not None:
        (d / "qemu-aarch64").write_text(("enabled" if enabled else "disabled") +
                                        "\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    return d


QEMU = {"qemu-aarch64-static": "true", "update-binfmts": "true"}


@pytest.mark.parametrize("arch", ["arm64", "aarch64"])
def test_an_arm64_host_needs_nothing(tmp_path, arch):
    proc = _run(tmp_path, _tools(tmp_path), arch=arch)
    assert proc.returncode == 0 and "arm64 host: no emulation needed" in proc.stdout


def test_an_enabled_handler_is_ready(tmp_path):
    _binfmt(tmp_path, mounted=True, enabled=True)
    proc = _run(tmp_path, _tools(tmp_path, uid=1000), "--check")
    assert proc.returncode == 0, proc.stderr
    assert "arm64 emulation ready" in proc.stdout


@pytest.mark.parametrize(("uid", "fakes", "check", "message"), [
    (1000, {}, False, "qemu-user-static binfmt-support not installed and not root "
                      "(apt-get install qemu-user-static binfmt-support as root)"),
    (0, {}, False, "qemu-user-static binfmt-support not installed and no apt-get here"),
    (0, {}, True, "qemu-user-static binfmt-support not installed (run "
                  "images/bin/arm64-emulation.sh as root)"),
    (0, {"apt-get": "exit 100"}, False,
     "apt-get update failed (needed for qemu-user-static binfmt-support)"),
    (0, {"apt-get": '[ "$1" = update ] || exit 100'}, False,
     "apt-get install qemu-user-static binfmt-support failed"),
])
def test_missing_packages_are_named(tmp_path, uid, fakes, check, message):
    proc = _run(tmp_path, _tools(tmp_path, uid=uid, **fakes), *(["--check"] if check else []))
    assert proc.returncode == 1
    assert proc.stderr.endswith(f"error: arm64 emulation on amd64: {message}\n"), proc.stderr
    assert proc.stderr.count("error:") == 1


def test_an_unmounted_binfmt_misc_is_mounted_or_named(tmp_path):
    d = _binfmt(tmp_path, mounted=False, enabled=None)
    refused = _run(tmp_path, _tools(tmp_path, **QEMU, mount="exit 32"))
    assert refused.returncode == 1
    assert refused.stderr == (f"error: arm64 emulation on amd64: mount -t binfmt_misc binfmt_misc "
                              f"{d} refused (a container needs --privileged)\n")
    not_root = _run(tmp_path, _tools(tmp_path / "u", uid=1000, **QEMU))
    assert not_root.stderr.startswith(f"error: arm64 emulation on amd64: binfmt_misc not mounted "
                                      f"on {d} and not root"), not_root.stderr


def test_mount_then_enable_makes_it_ready(tmp_path):
    d = _binfmt(tmp_path, mounted=False, enabled=None)
    bin_ = _tools(tmp_path, **{
        "qemu-aarch64-static": "true",
        "mount": f"touch {d}/register",
        "update-binfmts": f'[ "$*" = "--enable qemu-aarch64" ] && echo enabled > {d}/qemu-aarch64'})
    proc = _run(tmp_path, bin_)
    assert proc.returncode == 0, proc.stderr
    assert (d / "qemu-aarch64").read_text() == "enabled\n"


def test_an_enable_that_does_not_take_is_named(tmp_path):
    d = _binfmt(tmp_path, mounted=True, enabled=False)
    proc = _run(tmp_path, _tools(tmp_path, **QEMU))
    assert proc.returncode == 1
    assert proc.stderr == (f"error: arm64 emulation on amd64: update-binfmts --enable qemu-aarch64 "
                           f"did not enable {d}/qemu-aarch64\n")


def test_the_gb10_path_calls_it():
    for script in ("image-build.sh", "image-base.sh", "image-gates.sh"):
        text = (ROOT / "images" / "bin" / script).read_text()
        assert "images/bin/arm64-emulation.sh" in text, script
    assert os.access(SCRIPT, os.X_OK)
