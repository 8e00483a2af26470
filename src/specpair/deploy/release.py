"""Release files: releases/<name>.yml names the pair's images BY DIGEST and its config.

    name: b                                  # lowercase [a-z0-9._-], the file's stem
    profiles: {target: cpu, drafter: cpu}    # image profile per role (cpu, gb10, rtx3090)
    images:
      target: sha256:<64 hex>                # local image ID, or repo@sha256:<64 hex>
      drafter: registry.lan/specpair-drafter@sha256:<64 hex>
    config:                                  # everything the pair runs with; hashed
      depth: 4                               # K, draft tokens per round (1..16)
      drafter_mode: sampled                  # sampled | greedy (specpair.draft.DraftMode)

A host's release record (roles/specpair_release) stores the current and previous release
with `config_hash` = sha256 of the config as compact key-sorted JSON; the playbook computes
the same value (`to_json(sort_keys=True, separators=[',', ':']) | hash('sha256')`).
The role checks the same rules as `load_release`, so a bad file fails before anything moves.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specpair.deploy.errors import ImageNotFound, ReleaseError

__all__ = ["Release", "config_hash", "load_release", "write_release", "resolve_image",
           "PROFILES", "DRAFTER_MODES", "MAX_DEPTH"]

PROFILES = ("cpu", "gb10", "rtx3090")
DRAFTER_MODES = ("sampled", "greedy")
MAX_DEPTH = 16
ROLES = ("target", "drafter")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_IMAGE = re.compile(r"^([^@\s]+@)?sha256:[0-9a-f]{64}$")


def config_hash(config: dict[str, Any]) -> str:
    """sha256 hex of the config as compact, key-sorted JSON (the playbook's formula)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Release:
    """One release of the pair."""

    name: str  # lowercase [a-z0-9._-]; the file is releases/<name>.yml
    profiles: dict[str, str]  # role (target, drafter) -> image profile
    images: dict[str, str]  # role (target, drafter) -> sha256:<id> or repo@sha256:<digest>
    config: dict[str, Any]  # depth, drafter_mode, ...; what config_hash covers

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "profiles": dict(self.profiles),
                "images": dict(self.images), "config": dict(self.config)}


def _check(data: Any, where: str) -> Release:
    if not isinstance(data, dict):
        raise ReleaseError(f"{where}: a release is a mapping, got {type(data).__name__}")
    unknown = set(data) - {"name", "profiles", "images", "config"}
    if unknown:
        raise ReleaseError(f"{where}: unknown keys {sorted(unknown)}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ReleaseError(f"{where}: name must match {_NAME.pattern}, got {name!r}")
    for key, pattern, allowed in (("profiles", None, PROFILES), ("images", _IMAGE, None)):
        value = data.get(key)
        if not isinstance(value, dict) or set(value) != set(ROLES):
            raise ReleaseError(f"{where}: {key} must map exactly {list(ROLES)}, got {value!r}")
        for role, v in value.items():
            ok = (v in allowed) if allowed else (isinstance(v, str) and pattern.match(v))
            if not ok:
                want = (f"one of {list(allowed)}" if allowed
                        else "sha256:<64 hex> or repo@sha256:<64 hex>")
                raise ReleaseError(f"{where}: {key}.{role} must be {want}, got {v!r}")
    config = data.get("config")
    if not isinstance(config, dict):
        raise ReleaseError(f"{where}: config must be a mapping, got {config!r}")
    depth = config.get("depth")
    if type(depth) is not int or not 1 <= depth <= MAX_DEPTH:
        raise ReleaseError(f"{where}: config.depth must be an integer in 1..{MAX_DEPTH}, "
                           f"got {depth!r}")
    if config.get("drafter_mode") not in DRAFTER_MODES:
        raise ReleaseError(f"{where}: config.drafter_mode must be one of {list(DRAFTER_MODES)}, "
                           f"got {config.get('drafter_mode')!r}")
    return Release(name, dict(data["profiles"]), dict(data["images"]), dict(config))


def load_release(path: str | Path) -> Release:
    """Read and check a release file; ReleaseError names the bad field."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ReleaseError(f"cannot read release file {p}: {e}") from e
    release = _check(data, str(p))
    if p.stem != release.name:
        raise ReleaseError(f"{p}: the file names release {release.name!r}; "
                           f"call it {release.name}.yml")
    return release


def write_release(release: Release, directory: str | Path) -> Path:
    """Write releases/<name>.yml (checked first); returns its path."""
    _check(release.to_dict(), f"release {release.name!r}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{release.name}.yml"
    header = (f"# specpair release {release.name} (specpair.deploy.release documents the format)\n"
              f"# config_hash: {release.config_hash}\n")
    path.write_text(header + yaml.safe_dump(release.to_dict(), sort_keys=False))
    return path


def resolve_image(ref: str, docker: str = "docker") -> str:
    """The local image ID (sha256:...) of an image reference, from the Docker engine."""
    out = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", ref],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ImageNotFound(f"image {ref!r} is not in the local Docker engine: "
                            f"{out.stderr.strip() or 'docker image inspect failed'}")
    return out.stdout.strip()
