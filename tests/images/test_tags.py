"""One tag scheme: images/bin/image-tag.sh is what `make image` tags, and compose, the gates, the
local pair, the release CLI and the Ansible images role name the same tags (no build here)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from specpair.deploy.release import image_tag

from .conftest import ROOT

VERSION = re.search(r'(?m)^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text()).group(1)
# compose file -> (service, role, profile) of every service.
COMPOSE = {"x86host.yml": [("drafter", "drafter", "rtx3090")],
           "sparkhead.yml": [("target", "target", "gb10")],
           "sparkworker.yml": [("target-worker", "target", "gb10")],
           "local-cpu.yml": [("drafter", "drafter", "cpu"), ("target", "target", "cpu")],
           # make up TP=2: the override over the local pair (files joined by "+")
           "local-cpu.yml+local-cpu-tp2.yml": [("drafter", "drafter", "cpu"),
                                               ("target", "target", "cpu"),
                                               ("target-worker", "target", "cpu")]}


def _tag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "images" / "bin" / "image-tag.sh"), *args],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(("role", "profile"), [("drafter", "cpu"), ("drafter", "rtx3090"),
                                               ("target", "cpu"), ("target", "gb10")])
def test_the_tag_carries_role_profile_and_pyprojects_version(role, profile):
    proc = _tag(role, profile)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"specpair-{role}:{profile}-{VERSION}\n"
    assert image_tag(role, profile, ROOT) == proc.stdout.strip()  # the release CLI's default


def test_variant_and_version_alone():
    assert _tag("target", "cpu", "nofix").stdout == f"specpair-target:cpu-nofix-{VERSION}\n"
    assert _tag("--version").stdout == f"{VERSION}\n"


@pytest.mark.parametrize("args", [("target", "rtx3090"), ("drafter", "gb10"), ("target", "cpu",
                                                                               "No-Fix")])
def test_bad_input_is_refused(args):
    proc = _tag(*args)
    assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr


def test_make_image_and_the_scripts_use_the_scheme():
    build = (ROOT / "images" / "bin" / "image-build.sh").read_text()
    assert 'tag=${3:-$(images/bin/image-tag.sh "$role" "$profile")}' in build
    verify = (ROOT / "images" / "bin" / "image-verify.sh").read_text()
    assert 'tags[$role]=$(images/bin/image-tag.sh "$role" "$profile")' in verify
    assert "specpair-$role:$profile" not in verify
    assert "images/bin/image-tag.sh" in (ROOT / "scripts" / "local-pair.sh").read_text()


@pytest.mark.parametrize(("profile", "tags"), [
    ("cpu", [f"specpair-drafter:cpu-{VERSION}", f"specpair-target:cpu-{VERSION}"]),
    ("rtx3090", [f"specpair-drafter:rtx3090-{VERSION}"]),
    ("gb10", [f"specpair-target:gb10-{VERSION}"])])
def test_make_gates_names_the_tags_make_image_gives(profile, tags):
    proc = subprocess.run(["make", "-n", "--no-print-directory", "gates", f"PROFILE={profile}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "images/bin/image-gates.sh" in ln)
    assert line.split("images/bin/image-gates.sh", 1)[1].split() == tags


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose (v1, Debian) not installed; images/bin/image-tools.sh")
@pytest.mark.parametrize("name", sorted(COMPOSE))
def test_compose_names_the_tags_make_image_gives(name, tmp_path):
    key = tmp_path / "key"
    key.write_text("k" * 32)
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "SPECPAIR_KEY_FILE": str(key),
           "SPECPAIR_VERSION": _tag("--version").stdout.strip(), "SPARKHEAD_ADDR": "10.0.0.1",
           "SPECPAIR_DRAFTER_ADDR": "10.0.0.3:7360", "SPECPAIR_DRAFTER_CPUS": "0"}
    files = [arg for f in name.split("+") for arg in ("-f", str(ROOT / "compose" / f))]
    proc = subprocess.run(["docker-compose", *files, "config"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    assert sorted(services) == sorted(s for s, _, _ in COMPOSE[name])
    for service, role, profile in COMPOSE[name]:
        assert services[service]["image"] == _tag(role, profile).stdout.strip(), service


def test_the_images_role_tags_a_transferred_image_by_the_scheme():
    tasks = yaml.safe_load((ROOT / "roles" / "specpair_images" / "tasks" / "main.yml").read_text())
    steps = {t["name"]: t for t in tasks[0]["block"]}
    tag = steps["Tag the transferred image specpair-ROLE:PROFILE-VERSION"]
    repo = " ".join(tag["community.docker.docker_image_tag"]["repository"][0].split())
    assert repo.startswith("specpair-{{ specpair_images_labels['io.specpair.role'] }}:")
    assert "['io.specpair.profile'] }}-{{" in repo
    assert "['org.opencontainers.image.version'] | replace('+', '_') }}" in repo
