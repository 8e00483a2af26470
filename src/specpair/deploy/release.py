"""Release files: releases/<name>.yml names the pair's images BY DIGEST and its config.

    name: b                                  # lowercase [a-z0-9._-], the file's stem
    profiles: {target: cpu, drafter: cpu}    # image profile per role (cpu, gb10, rtx3090)
    images:
      target: sha256:<64 hex>                # local image ID, or repo@sha256:<64 hex>
      drafter: registry.lan/specpair-drafter@sha256:<64 hex>
    config:                                  # everything the pair runs with; hashed
      depth: 4                               # K, draft tokens per round (1..16)
      drafter_mode: sampled                  # sampled | greedy (specpair.draft.DraftMode)

Config values are JSON's: strings, integers, finite floats, booleans, null, lists, and mappings
with string keys; a date, binary, set, NaN or infinity, or a non-string key is refused with its
key path (``config.a.b[2]``), since the hash is of the JSON text.

A host's release record (roles/specpair_release) stores the current and previous release
with `config_hash` = sha256 of the config as compact key-sorted JSON; the playbook computes
the same value (`to_json(sort_keys=True, separators=[',', ':']) | hash('sha256')`).
The role checks the same rules as `load_release`, so a bad file fails before anything moves.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specpair.deploy.errors import ImageNotFound, ReleaseError
from specpair.errors import CannotRun
from specpair.yamlio import YamlRefused, excerpt, load_yaml

__all__ = ["Release", "is_release_name", "config_hash", "check_release_config", "parse_release",
           "load_release", "write_release", "resolve_image", "image_tag", "PROFILES",
           "DRAFTER_MODES", "MAX_DEPTH"]

PROFILES = ("cpu", "gb10", "rtx3090")
DRAFTER_MODES = ("sampled", "greedy")
MAX_DEPTH = 16
ROLES = ("target", "drafter")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_IMAGE = re.compile(r"^([^@\s]+@)?sha256:[0-9a-f]{64}$")


def is_release_name(text: str) -> bool:
    """Whether ``text`` is a release name (lowercase [a-z0-9._-], at most 64 characters)."""
    return bool(_NAME.match(text))


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


def _check_json(value: Any, path: str, where: str) -> None:
    """Refuse a config value that has no exact JSON form, naming its key path."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ReleaseError(f"{where}: {path} has the key {excerpt(k)} "
                                   f"({type(k).__name__}); config keys must be strings")
            _check_json(v, f"{path}.{k}", where)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]", where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ReleaseError(f"{where}: {path} is {value}; config numbers must be finite")
    elif value is not None and not isinstance(value, str | int | float):  # bool is an int
        dated = isinstance(value, datetime.date)  # YAML reads 2024-01-01 as a date
        what = ("a timestamp" if isinstance(value, datetime.datetime) else "a date" if dated
                else "binary data" if isinstance(value, bytes) else f"a {type(value).__name__}")
        raise ReleaseError(f"{where}: {path} is {what} ({excerpt(value)}); config values must "
                           "be strings, numbers, booleans, null, lists or mappings"
                           f"{' (quote it to keep it as text)' if dated else ''}")


def _check(data: Any, where: str, *, images: bool = True) -> Release:
    if not isinstance(data, dict):
        raise ReleaseError(f"{where}: a release is a mapping, got {type(data).__name__}")
    unknown = set(data) - {"name", "profiles", "images", "config"}
    if unknown:
        raise ReleaseError(f"{where}: unknown keys {excerpt(sorted(map(str, unknown)))}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ReleaseError(f"{where}: name must match {_NAME.pattern}, got {excerpt(name)}")
    for key, pattern, allowed in (("profiles", None, PROFILES), ("images", _IMAGE, None)
                                  )[:2 if images else 1]:
        value = data.get(key)
        if not isinstance(value, dict) or set(value) != set(ROLES):
            raise ReleaseError(f"{where}: {key} must map exactly {list(ROLES)}, got "
                               f"{excerpt(value)}")
        for role, v in value.items():
            ok = (v in allowed) if allowed else (isinstance(v, str) and pattern.match(v))
            if not ok:
                want = (f"one of {list(allowed)}" if allowed
                        else "sha256:<64 hex> or repo@sha256:<64 hex>")
                raise ReleaseError(f"{where}: {key}.{role} must be {want}, got {excerpt(v)}")
    config = data.get("config")
    if not isinstance(config, dict):
        raise ReleaseError(f"{where}: config must be a mapping, got {excerpt(config)}")
    _check_json(config, "config", where)
    depth = config.get("depth")
    if type(depth) is not int or not 1 <= depth <= MAX_DEPTH:
        raise ReleaseError(f"{where}: config.depth must be an integer in 1..{MAX_DEPTH}, "
                           f"got {excerpt(depth)}")
    if config.get("drafter_mode") not in DRAFTER_MODES:
        raise ReleaseError(f"{where}: config.drafter_mode must be one of {list(DRAFTER_MODES)}, "
                           f"got {excerpt(config.get('drafter_mode'))}")
    return Release(name, dict(data["profiles"]), dict(data.get("images", {})), dict(config))


def parse_release(data: Any, where: str) -> Release:
    """A release from its mapping (a release file's, or a release record's entry), checked."""
    return _check(data, where)


def check_release_config(name: str, profiles: dict[str, str], config: dict[str, Any]) -> None:
    """Check a release's name, profiles and config before its images are resolved."""
    _check({"name": name, "profiles": profiles, "config": config}, f"release {excerpt(name)}",
           images=False)


def load_release(path: str | Path) -> Release:
    """Read and check a release file; ReleaseError names the bad field."""
    p = Path(path)
    try:
        data = load_yaml(p, "release file")
    except YamlRefused as e:
        raise ReleaseError(str(e)) from None
    release = _check(data, str(p))
    if p.stem != release.name:
        raise ReleaseError(f"{p}: the file names release {release.name!r}; "
                           f"call it {release.name}.yml")
    return release


def write_release(release: Release, directory: str | Path,
                  sources: dict[str, str] | None = None) -> Path:
    """Write releases/<name>.yml (checked first); returns its path.

    ``sources`` (role -> the tag an image was resolved from) is recorded as a comment.
    """
    _check(release.to_dict(), f"release {release.name!r}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{release.name}.yml"
    header = (f"# specpair release {release.name} (specpair.deploy.release documents the format)\n"
              f"# config_hash: {release.config_hash}\n")
    for role, ref in sorted((sources or {}).items()):
        header += f"# {role}: {ref} = {release.images[role]}\n"
    path.write_text(header + yaml.safe_dump(release.to_dict(), sort_keys=False))
    return path


def image_tag(role: str, profile: str, root: Path) -> str:
    """The tag `make image` gives the ROLE image of PROFILE: images/bin/image-tag.sh, the one tag
    scheme (specpair-ROLE:PROFILE-VERSION, VERSION from pyproject.toml)."""
    out = subprocess.run([str(root / "images" / "bin" / "image-tag.sh"), role, profile],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ReleaseError(out.stderr.strip() or f"images/bin/image-tag.sh {role} {profile} failed")
    return out.stdout.strip()


def resolve_image(ref: str, docker: str = "docker") -> str:
    """The local image ID (sha256:...) of an image reference, from the Docker engine."""
    try:
        out = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", ref],
                             capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise CannotRun(f"cannot resolve image {ref!r}: no {docker} command on this host") from None
    if out.returncode != 0:
        raise ImageNotFound(f"image {ref!r} is not in the local Docker engine: "
                            f"{out.stderr.strip() or 'docker image inspect failed'}")
    return out.stdout.strip()
