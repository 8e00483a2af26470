"""ansible-lint (production profile) and ansible-playbook --syntax-check on both inventories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAYBOOKS = ["deploy.yml", "rollback.yml", "restore-pair.yml", "gates.yml", "health.yml"]


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


def test_ansible_lint_production_profile_is_clean():
    out = subprocess.run([str(BIN / "ansible-lint"), "--offline", "--profile", "production",
                          "--nocolor", "playbooks", "roles", "inventories/prod",
                          "inventories/local"],
                         cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=600,
                         check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in out.stderr


@pytest.mark.parametrize("inventory", ["local", "prod"])
def test_every_playbook_parses_on_both_inventories(inventory):
    out = subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", "-i",
                          f"inventories/{inventory}", *(f"playbooks/{p}" for p in PLAYBOOKS)],
                         cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=300,
                         check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_every_role_has_commented_prefixed_defaults_and_an_argument_spec():
    for role in sorted((ROOT / "roles").iterdir()):
        defaults = (role / "defaults" / "main.yml").read_text().splitlines()
        assert (role / "meta" / "argument_specs.yml").is_file(), role.name
        previous = ""
        for line in defaults:
            if line and not line.startswith((" ", "#", "-")):
                assert line.startswith(f"{role.name}_"), f"{role.name}: {line}"
                assert previous.startswith("#"), f"{role.name}: no comment above {line}"
            if line and not line.startswith(" "):
                previous = line
