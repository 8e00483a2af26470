"""Inside the gb10 target image (linux/arm64; elsewhere under qemu: images/bin/arm64-emulation.sh):
vLLM imports (on an arm64 host only: under qemu the import of torch dies), `specpair overlay
verify` passes against the CUDA variant's pinned hashes, the attestation gate passes through
images/bin/image-gates.sh (its file alone: pytest imports what it collects), and the compiled wire
module loads (by its file) and encodes. The gates that compute with torch (rng, vLLM sampling)
are for the real Spark: under qemu torch's oneDNN cannot read MIDR_EL1 and the process dies
(images/README.md "Hardware profiles").
Runs when the image is loaded in Docker (`make image PROFILE=gb10`) and arm64 binaries can run
here; skips, saying which is missing, otherwise (CI does not build the hardware images).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specpair.deploy.release import image_tag

from .conftest import ROOT

IMAGE = image_tag("target", "gb10", ROOT)
RUN_TIMEOUT_S = 900  # one emulated Python start that imports vLLM: minutes on a busy 2-core box
SITE = 'python -c "import sysconfig; print(sysconfig.get_paths()[\\"purelib\\"])"'


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = ["docker", "run", "--rm", "--platform", "linux/arm64", "--network", "none", IMAGE]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None:
        pytest.skip("no docker command on this host: the gb10 image test needs Docker")
    inspect = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Architecture}}", IMAGE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if inspect.returncode != 0:
        pytest.skip(f"{IMAGE} is not loaded in docker (build it: make image PROFILE=gb10)")
    assert inspect.stdout.strip() == "arm64", inspect.stdout
    emu = subprocess.run(
        [str(ROOT / "images" / "bin" / "arm64-emulation.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if emu.returncode != 0:
        pytest.skip(f"arm64 binaries cannot run here: {emu.stderr.strip()}")
    return IMAGE


def test_vllm_imports(image: str) -> None:
    if platform.machine() not in ("aarch64", "arm64"):
        pytest.skip("import vllm loads torch, whose oneDNN dies at import under qemu "
                    "(xbyak_aarch64 cannot read MIDR_EL1; SIGSEGV, status 139: images/README.md): "
                    "this check needs an arm64 host, the Spark")
    proc = _run("python", "-c", "import vllm; print(vllm.__version__)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "0.32.0"


def test_overlay_verify_passes_against_the_cuda_variant(image: str) -> None:
    proc = _run("sh", "-c", f'specpair overlay verify --json --site-packages "$({SITE})"')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    manifest = json.loads((ROOT / "overlays/vllm/0.32.0/manifest.json").read_text())
    status = report["status"]
    assert report["ok"] and status["state"] == "applied" and status["variant"] == "cuda"
    assert sorted(status["files"]) == sorted(manifest["files"])


def test_the_attestation_gate_passes(image: str, tmp_path: Path) -> None:
    # only the attestation gate's file: pytest imports every module it collects, and the
    # others import torch, which kills the emulated process (images/bin/image-gates.sh)
    env = dict(os.environ, GATES_OUT=str(tmp_path),
               GATES_TESTS="tests/gates/test_attestation_gate.py")
    proc = subprocess.run(
        [str(ROOT / "images" / "bin" / "image-gates.sh"), image],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    xml = tmp_path / (image.replace(":", "-").replace("/", "-") + ".xml")
    cases = ET.parse(xml).getroot().iter("testcase")
    ran = {c.get("name"): [x.tag for x in c] for c in cases}
    assert ran == {
        "test_installed_vllm_matches_its_attestation": [],
        "test_control_a_changed_byte_is_caught": [],
    }, ran


def test_the_compiled_wire_module_loads_and_encodes(image: str) -> None:
    # loaded from its file: importing the specpair.wire.codec package imports torch (its
    # frames), which kills the emulated process; the compiled module itself needs only numpy
    code = (
        "import glob, importlib.util, os\n"
        "import numpy as np\n"
        "pkg = importlib.util.find_spec('specpair').submodule_search_locations[0]\n"
        "path, = glob.glob(os.path.join(pkg, 'wire', 'codec', '_sparse.*.so'))\n"
        "spec = importlib.util.spec_from_file_location('specpair.wire.codec._sparse', path)\n"
        "_sparse = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(_sparse)\n"
        "print(_sparse.__file__)\n"
        "print(_sparse.i32(np.arange(4, dtype=np.int64), 0).hex())\n"
    )
    proc = _run("python", "-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    path, blob = proc.stdout.split()
    assert path.endswith("-aarch64-linux-gnu.so"), path
    assert blob == "00000000010000000200000003000000"
