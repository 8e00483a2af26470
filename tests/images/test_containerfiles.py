"""The Containerfile and the compose files follow the image rules (checked statically)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from .conftest import ROOT

CONTAINERFILE = ROOT / "images" / "Containerfile"
COMPOSE = sorted((ROOT / "compose").glob("*.yml"))


def _lines() -> list[str]:
    return CONTAINERFILE.read_text().splitlines()


def _stage(lines: list[str], stage: str) -> list[str]:
    """The lines of one stage: from its FROM to the next FROM."""
    start = lines.index(next(ln for ln in lines if re.match(rf"FROM \S+ AS {stage}$", ln)))
    body = [lines[start]]
    for ln in lines[start + 1:]:
        if ln.startswith("FROM "):
            break
        body.append(ln)
    return body


def _image(role: str) -> list[str]:
    """What one role's image is built from: the lines before the first FROM (global ARGs), then
    its stages base first (the FROM chain followed back from the role's own stage)."""
    lines = _lines()
    stages, stage = [], role
    while stage != "scratch":
        body = _stage(lines, stage)
        stages.insert(0, body)
        stage = body[0].split()[1]
    preamble = lines[:lines.index("FROM scratch AS base")]
    return preamble + [ln for body in stages for ln in body]


def test_one_base_venv_and_app_stage_serve_both_roles():
    lines = _lines()
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms == ["FROM scratch AS base", "FROM base AS venv", "FROM venv AS app",
                     "FROM app AS target", "FROM app AS drafter", "FROM drafter AS cuda"]
    assert "COPY images/lock/${PROFILE}-${ROLE}.txt /opt/specpair/lock.txt" in lines
    script = (ROOT / "images" / "bin" / "image-build.sh").read_text()
    assert '--build-arg ROLE="$role"' in script
    assert '--file "$ctx/images/Containerfile"' in script


def test_every_new_arg_has_a_comment():
    lines = _lines()
    seen: set[str] = set()
    for i, line in enumerate(lines):
        m = re.match(r"ARG (\w+)", line)
        if not m or m.group(1) in seen:
            continue
        seen.add(m.group(1))
        assert lines[i - 1].startswith("#"), f"ARG {m.group(1)} has no comment above it"


@pytest.mark.parametrize("role", ["drafter", "target"])
def test_stages_are_named_and_nothing_floats(role):
    lines = _image(role)
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2
    assert all(re.match(r"FROM \S+ AS [a-z]+$", ln) for ln in froms), froms
    assert froms[0] == "FROM scratch AS base", "the base is the locked mmdebstrap rootfs"
    text = "\n".join(lines)
    assert ":latest" not in text and "latest" not in text.lower()
    assert "--require-hashes" in text and "--no-deps" in text


@pytest.mark.parametrize("role", ["drafter", "target"])
def test_no_ca_bundle_and_no_index_in_the_build(role):
    """The extra CA is given to the host-side download only; the build installs offline."""
    text = "\n".join(_image(role))
    for line in text.splitlines():
        if line.startswith(("COPY", "ADD")):
            assert not re.search(r"\.(pem|crt)\b|ca-certificates", line), line
    assert "PIP_CERT" not in text and "ca.pem" not in text
    assert "--no-index --find-links /run/specpair/wheels" in text
    script = (ROOT / "images" / "bin" / "image-build.sh").read_text()
    assert '--cert "$CA_BUNDLE"' in script


@pytest.mark.parametrize("role", ["drafter", "target"])
def test_oci_labels(role):
    text = "\n".join(_stage(_lines(), role))
    wanted = ["org.opencontainers.image.source", "org.opencontainers.image.revision",
              "org.opencontainers.image.version", "io.specpair.profile"]
    if role == "target":
        wanted += ["io.specpair.vllm-version", "io.specpair.overlay-id"]
    for label in wanted:
        assert f"{label}=" in text, f"{role} lacks label {label}"


def test_target_applies_and_verifies_the_overlay_during_the_build():
    text = "\n".join(_stage(_lines(), "target"))
    assert "specpair overlay apply --site-packages" in text
    assert "specpair overlay verify --site-packages" in text


@pytest.mark.parametrize("role", ["drafter", "target"])
def test_the_tiny_pair_is_made_on_the_build_host_and_copied_in(role):
    """No torch compute in a build: under arm64 emulation it dies (xbyak_aarch64, exit 139)."""
    lines = _image(role)
    assert "COPY models /opt/specpair/models" in lines
    runs = " ".join(ln for ln in lines if not ln.startswith("#"))
    assert "make-tiny" not in runs
    script = (ROOT / "images" / "bin" / "image-build.sh").read_text()
    assert '"$py" -m specpair models make-tiny --out "$ctx/models"' in script
    assert "--seed 0" in script


def _cmd(lines: list[str], stage: str) -> str:
    text = "\n".join(_stage(lines, stage))
    return text[text.index("CMD ["):]


def test_each_drafter_image_defaults_to_its_hardware():
    lines = _lines()
    assert '"--device", "cpu"' in _cmd(lines, "drafter")
    assert '"--device", "cuda"' in _cmd(lines, "cuda")
    script = (ROOT / "images" / "bin" / "image-build.sh").read_text()
    assert "drafter/cpu) arch=amd64 stage=drafter ;;" in script
    assert "drafter/rtx3090) arch=amd64 stage=cuda ;;" in script
    assert '--target "$stage"' in script


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_compose_services_use_host_networking_and_pinned_tags(path):
    doc = yaml.safe_load(path.read_text())
    assert doc["services"], path
    for name, svc in doc["services"].items():
        assert svc.get("network_mode") == "host", f"{path.name}:{name} must use host networking"
        assert "ports" not in svc, f"{path.name}:{name}: no port mapping without a bridge"
        image = svc["image"]
        assert re.fullmatch(r"specpair-(drafter|target):[\w.${}:?\s-]+", image), image
        assert not image.endswith(":latest")


def test_compose_has_one_file_per_host_role_and_the_local_pair():
    assert {p.stem for p in COMPOSE} >= {"sparkhead", "sparkworker", "x86host", "local-cpu"}


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose (v1, Debian) not installed; images/bin/image-tools.sh")
@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_compose_files_validate(path, tmp_path):
    key = tmp_path / "key"
    key.write_text("k" * 32)
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "SPECPAIR_KEY_FILE": str(key),
           "SPECPAIR_VERSION": "0.1.0", "SPARKHEAD_ADDR": "10.0.0.1",
           "SPECPAIR_DRAFTER_ADDR": "10.0.0.3:7360", "SPECPAIR_DRAFTER_CPUS": "0"}
    proc = subprocess.run(["docker-compose", "-f", str(path), "config", "--quiet"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


BUILDAH_PLATFORM_ARGS = {"TARGETPLATFORM", "TARGETOS", "TARGETARCH"}


def _build_arg_names(segment: str) -> set[str]:
    return set(re.findall(r"--build-arg (\w+)=", segment))


@pytest.mark.parametrize("role", ["drafter", "target"])
def test_the_build_passes_exactly_the_args_the_containerfile_declares(role):
    """buildah warns "one or more build args were not consumed" about any other, its own
    --platform args included (checked with buildah 1.28.2: an arg no built stage declares is
    named, one declared anywhere, before the first FROM too, is not)."""
    script = (ROOT / "images" / "bin" / "image-build.sh").read_text()
    common = re.search(r"^build_args=\((.*?)\)$", script, re.S | re.M)
    target_only = re.search(
        r'^if \[ "\$role" = target \]; then\n  build_args\+=\((.*?)\)$', script, re.S | re.M)
    assert common and target_only, "image-build.sh's build_args blocks moved"
    passed = _build_arg_names(common.group(1))
    if role == "target":
        passed |= _build_arg_names(target_only.group(1))
    declared = set(re.findall(r"^ARG (\w+)", "\n".join(_image(role)), re.M))
    assert declared >= BUILDAH_PLATFORM_ARGS, f"{role}: buildah would warn about them"
    declared -= BUILDAH_PLATFORM_ARGS  # buildah's own (--platform), not passed by the script
    assert passed == declared, (f"{role}: passed but not declared {sorted(passed - declared)}, "
                                f"declared but not passed {sorted(declared - passed)}")
    assert '"${build_args[@]}"' in script


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_the_metrics_directory_is_a_tmpfs_of_the_service_that_writes_there(path):
    """vLLM's engine opens its metric files in PROMETHEUS_MULTIPROC_DIR at start: a service
    without that directory fails to start (the target crash-looped with FileNotFoundError on
    /run/specpair-metrics when the tmpfs sat on the drafter instead)."""
    for name, svc in yaml.safe_load(path.read_text())["services"].items():
        env = svc.get("environment") or {}
        wanted = env.get("PROMETHEUS_MULTIPROC_DIR") if isinstance(env, dict) else None
        mounts = svc.get("tmpfs") or []
        if wanted:
            assert wanted in mounts, f"{path.name}:{name}: {wanted} is not a tmpfs"
        else:
            assert "/run/specpair-metrics" not in mounts, f"{path.name}:{name}: a stray tmpfs"
