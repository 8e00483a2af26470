"""Helpers of the overlay tests (a uniquely named module: tests dirs have no __init__)."""

from __future__ import annotations

import shutil
from pathlib import Path


def mini_site(manifest, unpacked_site: Path, dest: Path) -> Path:
    """A small site-packages with just the files the overlay reads (fast to copy per test)."""
    paths = {"vllm/__init__.py", *manifest.files}
    for v in manifest.variants.values():
        paths |= set(v.identity)
    for p in paths:
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(unpacked_site / p, dest / p)
    return dest


def snapshot(site: Path) -> dict[str, bytes]:
    """Every file under site (path -> bytes), to prove a refusal touched nothing."""
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*"))
            if p.is_file()}
