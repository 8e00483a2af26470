"""Fetch (cached) and unpack the pinned vLLM 0.32.0 wheels the overlay is built against.

Cache: ``$SPECPAIR_WHEEL_CACHE`` or ``~/.cache/specpair/wheels``. A missing wheel
is fetched with ``pip download`` (the ordinary client, so proxies and indexes
configured for pip apply); every wheel is checked against its pinned sha256.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from specpair.overlay.errors import WheelHashMismatch, WheelUnavailable
from specpair.overlay.manifest import Wheel, sha256_file

__all__ = ["cache_dir", "ensure_wheel", "unpack"]


def cache_dir() -> Path:
    env = os.environ.get("SPECPAIR_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specpair" / "wheels"


def ensure_wheel(wheel: Wheel, cache: Path | None = None) -> Path:
    """Path of the pinned wheel in the cache, downloading it once if needed."""
    cache = cache or cache_dir()
    path = cache / wheel.filename
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        version = wheel.filename.split("-")[1]
        # the first of the wheel's platform tags (e.g. manylinux_2_27_x86_64.manylinux_2_28_...)
        platform = wheel.filename.rsplit("-", 1)[1].removesuffix(".whl").split(".")[0]
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", platform, "--python-version", "3.11", "-d", str(cache),
            f"{wheel.project}=={version}",
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0 or not path.is_file():
            last = (run.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise WheelUnavailable(f"pip download of {wheel.filename} failed: {last}")
    got = sha256_file(path)
    if got != wheel.sha256:
        raise WheelHashMismatch(f"{path}: sha256 {got}, pinned {wheel.sha256}")
    return path


def unpack(wheel_path: Path, dest: Path, *, python_only: bool = True,
           package: str = "vllm") -> Path:
    """Unpack ``package/`` (only .py files by default) and the dist-info into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_path) as z:
        for info in z.infolist():
            name = info.filename
            keep = name.startswith(f"{package}/") and (not python_only or name.endswith(".py"))
            if keep or ".dist-info/" in name:
                z.extract(info, dest)
    return dest
