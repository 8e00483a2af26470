"""The Ansible gates role gives the gate container the GPUs where the host has NVIDIA devices
(a stand-in device root) and names the case; where there are none it passes no --gpus. A
stand-in `docker` on PATH records its argv and writes the JUnit file: no engine, no image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: {python}
    specpair_image_key: drafter
    specpair_gates_release: {{name: r1, images: {{drafter: "sha256:{id}"}}}}
    specpair_gates_image: "sha256:{id}"
    specpair_gates_controller: localhost
    specpair_gates_results_dir: {results}
    specpair_gates_artifacts_dir: {artifacts}
    specpair_gates_device_root: {root}
    specpair_gates_env: {{SPECPAIR_GATE_SIZE: quick}}
  roles:
    - specpair_gates
  post_tasks:
    - name: Show the outcome
      ansible.builtin.copy:
        content: "{{{{ specpair_gates_outcome | to_json }}}}"
        dest: {artifacts}/outcome.json
        mode: "0644"
"""

DOCKER = """#!/bin/bash
printf '%s\\n' "$@" > {argv}
for a in "$@"; do
  case "$a" in --junitxml=/gates-out/*) out={results}/${{a#--junitxml=/gates-out/}};; esac
done
echo '<testsuites><testsuite name="pytest"><testcase classname="g" name="t"/>' > "$out"
echo '</testsuite></testsuites>' >> "$out"
echo "1 passed"
"""


def _run(tmp_path: Path, devices: list[str]) -> tuple[list[str], dict]:
    root = tmp_path / "root"
    for d in devices:
        (root / d).parent.mkdir(parents=True, exist_ok=True)
        (root / d).touch()
    root.mkdir(exist_ok=True)
    (root / "dev").mkdir(exist_ok=True)
    results, artifacts, fake = tmp_path / "results", tmp_path / "artifacts", tmp_path / "bin"
    for d in (results, artifacts, fake):
        d.mkdir()
    argv = tmp_path / "argv"
    (fake / "docker").write_text(DOCKER.format(argv=argv, results=results))
    (fake / "docker").chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(id="a" * 64, results=results, artifacts=artifacts, root=root,
                                python=sys.executable))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "PATH": f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return argv.read_text().splitlines(), json.loads((artifacts / "outcome.json").read_text())


@pytest.mark.parametrize("devices", [["dev/nvidia0", "dev/nvidia1"], ["proc/driver/nvidia"]])
def test_a_host_with_nvidia_devices_gets_gpus_all(tmp_path, devices):
    argv, outcome = _run(tmp_path, devices)
    assert argv[0] == "run" and argv[argv.index("--gpus") + 1] == "all"
    found = " ".join("/" + d for d in sorted(devices))
    assert f"--env=SPECPAIR_HOST_GPUS={found}" in argv
    assert argv.index("--gpus") < argv.index("sha256:" + "a" * 64)  # a docker option, not pytest's
    assert outcome["gpus"] == f"host NVIDIA devices: {found} (--gpus all)"


def test_a_host_without_any_gets_none_and_says_so(tmp_path):
    argv, outcome = _run(tmp_path, [])
    assert "--gpus" not in argv
    assert "--env=SPECPAIR_HOST_GPUS=" in argv
    assert outcome["gpus"] == "host NVIDIA devices: none (NVML gates may skip)"
