"""Release files: the format's rules, the config hash, and the CLI's refusals (no Docker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specpair.deploy.errors import ReleaseError
from specpair.deploy.release import Release, config_hash, load_release, write_release

ID_A = "sha256:" + "a" * 64
DIGEST_B = "registry.lan/specpair-drafter@sha256:" + "b" * 64


def _release(**over) -> dict:
    base = {"name": "r1", "profiles": {"target": "cpu", "drafter": "cpu"},
            "images": {"target": ID_A, "drafter": DIGEST_B},
            "config": {"depth": 4, "drafter_mode": "sampled"}}
    base.update(over)
    return base


def _write(tmp_path: Path, data: dict, name: str = "r1") -> Path:
    p = tmp_path / f"{name}.yml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_valid_release_loads_with_its_config_hash(tmp_path):
    r = load_release(_write(tmp_path, _release()))
    assert r.images == {"target": ID_A, "drafter": DIGEST_B}
    assert r.config_hash == config_hash({"drafter_mode": "sampled", "depth": 4})
    assert len(r.config_hash) == 64


def test_config_hash_is_the_playbooks_formula():
    """roles/specpair_release computes to_json(sort_keys, compact) | hash('sha256').

    Ansible's filters run in a child: importing Ansible patches interpreter globals
    (sys.intern) that break a later torch import in this test process."""
    config = {"drafter_mode": "greedy", "depth": 7, "extra": {"z": [1, 2], "a": "é"}}
    child = ("import json, sys\n"
             "from ansible.plugins.filter.core import get_hash, to_json\n"
             "text = to_json(json.loads(sys.stdin.read()), sort_keys=True, separators=[',', ':'])\n"
             "print(get_hash(text, 'sha256'))\n")
    run = subprocess.run([sys.executable, "-c", child], input=json.dumps(config),
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == config_hash(config)


@pytest.mark.parametrize(("over", "field"), [
    ({"name": "Bad Name"}, "name"),
    ({"images": {"target": "specpair-target:cpu", "drafter": DIGEST_B}}, "images.target"),
    ({"images": {"target": ID_A}}, "images"),
    ({"profiles": {"target": "cpu", "drafter": "tpu"}}, "profiles.drafter"),
    ({"config": {"depth": 0, "drafter_mode": "sampled"}}, "config.depth"),
    ({"config": {"depth": True, "drafter_mode": "sampled"}}, "config.depth"),
    ({"config": {"depth": 3, "drafter_mode": "point"}}, "config.drafter_mode"),
    ({"latest": True}, "unknown keys"),
])
def test_a_bad_field_is_refused_by_name(tmp_path, over, field):
    with pytest.raises(ReleaseError, match=field.replace(".", r"\.")):
        load_release(_write(tmp_path, _release(**over)))


def test_the_file_must_be_named_after_the_release(tmp_path):
    with pytest.raises(ReleaseError, match="call it r1.yml"):
        load_release(_write(tmp_path, _release(), name="other"))


def test_write_then_load_round_trips(tmp_path):
    r = Release("b", {"target": "cpu", "drafter": "rtx3090"}, {"target": ID_A, "drafter": ID_A},
                {"depth": 2, "drafter_mode": "greedy"})
    path = write_release(r, tmp_path)
    assert load_release(path) == r
    assert f"config_hash: {r.config_hash}" in path.read_text()


def test_the_tags_the_ids_came_from_are_recorded_in_the_header(tmp_path):
    r = Release("b", {"target": "gb10", "drafter": "rtx3090"}, {"target": ID_A, "drafter": ID_A},
                {"depth": 2, "drafter_mode": "sampled"})
    path = write_release(r, tmp_path, sources={"target": "specpair-target:gb10-0.1.0",
                                               "drafter": "specpair-drafter:rtx3090-0.1.0"})
    text = path.read_text()
    assert f"# target: specpair-target:gb10-0.1.0 = {ID_A}\n" in text
    assert f"# drafter: specpair-drafter:rtx3090-0.1.0 = {ID_A}\n" in text
    assert load_release(path) == r


def test_release_new_defaults_to_the_tags_make_image_gives(tmp_path):
    fake = tmp_path / "docker"  # an engine without the image: the error names the ref it tried
    fake.write_text("#!/bin/sh\necho 'Error: No such image' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parents[2] / "src"),
                                                    os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-m", "specpair", "release", "new", "x",
                          "--target-profile", "gb10", "--drafter-profile", "rtx3090",
                          "--dir", str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert out.returncode == 4
    version = subprocess.run([str(Path(__file__).parents[2] / "images" / "bin" / "image-tag.sh"),
                              "--version"], capture_output=True, text=True).stdout.strip()
    assert f"image 'specpair-target:gb10-{version}' is not in the local Docker engine" \
        in out.stderr, out.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specpair", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300, check=False)


def test_deploy_refuses_a_bad_release_file_before_ansible_runs(tmp_path):
    bad = _write(tmp_path, _release(config={"depth": 99, "drafter_mode": "sampled"}))
    out = _cli("deploy", "--inventory", "local", "--release", str(bad))
    assert out.returncode == 4
    assert "config.depth must be an integer in 1..16" in out.stderr


def test_an_unknown_inventory_is_refused():
    out = _cli("rollback", "--inventory", "staging")
    assert out.returncode == 4
    assert "no inventory 'staging'" in out.stderr and "prod" in out.stderr


def test_production_needs_typed_confirmation(tmp_path):
    good = _write(tmp_path, _release())
    out = _cli("deploy", "--inventory", "prod", "--release", str(good))
    assert out.returncode == 4
    assert "pass --confirm prod" in out.stderr
    # A wrong confirmation reaches the playbook, whose first play (on the controller only)
    # refuses it before any pair host is contacted.
    out = _cli("deploy", "--inventory", "prod", "--release", str(good), "--confirm", "prdo",
               "--json")
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout)
    assert any("type its name to confirm" in f for f in result["failures"]), result["failures"]
    assert set(result["stats"]) == {"controller"}


def test_release_show_prints_the_hash(tmp_path):
    out = _cli("release", "show", str(_write(tmp_path, _release())), "--json")
    assert out.returncode == 0, out.stderr
    want = config_hash({"depth": 4, "drafter_mode": "sampled"})
    assert json.loads(out.stdout)["config_hash"] == want


def _has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def test_health_on_every_host_of_an_inventory_skips_without_a_gpu():
    """`specpair health --inventory local`: the probe on each host; exit 3 is a skip there."""
    out = _cli("health", "--inventory", "local", "--json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    run_dir = Path(json.loads(out.stdout)["run_dir"])
    saved = json.loads((run_dir / "reports" / "health.json").read_text())
    assert set(saved) == {"local-sparkhead", "local-sparkworker", "local-x86host"}
    want = {"pass", "warn"} if _has_nvml() else {"skip"}
    assert {h["status"] for h in saved.values()} <= want, saved
    if not _has_nvml():
        assert all(h["rc"] == 3 and "cannot probe" in h["stderr"] for h in saved.values())


@pytest.mark.skipif(_has_nvml(), reason="this host has NVML: its probe never says 'cannot probe'")
def test_cannot_probe_is_fatal_where_the_inventory_says_so():
    """inventories/prod sets specpair_health_unprobeable: fail; the same role, locally."""
    root = Path(__file__).resolve().parents[2]
    bindir = Path(sys.executable).parent
    out = subprocess.run([str(bindir / "ansible-playbook"), "-i", "inventories/local",
                          "playbooks/health.yml", "-e", "specpair_health_unprobeable=fail"],
                         cwd=root, capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg")})
    assert out.returncode != 0
    assert "cannot probe: fatal on this inventory" in out.stdout
