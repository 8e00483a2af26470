"""Regenerate the overlay manifest from the pinned wheels (maintainers only).

``specpair overlay manifest`` keeps the manifest's ``overlay_id``, ``vllm_version``
and ``variants[*].wheel`` pins, unpacks every variant's wheel, and recomputes the
``identity`` hashes, the patch list (with each patch file's sha256) and each
touched file's base and result sha256 by applying the series in memory.
Commit the result; ``apply`` then trusts nothing but these pins.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specpair.overlay.manifest import Wheel, sha256_bytes, sha256_file
from specpair.overlay.unified_diff import apply_file_patch, parse_patch
from specpair.overlay.wheels import ensure_wheel, unpack

__all__ = ["IDENTITY_FILES", "build_manifest"]

IDENTITY_FILES = ("vllm/_version.py", "vllm/platforms/__init__.py")  # differ per build


def build_manifest(directory: Path) -> dict:
    """The manifest for the patches in ``directory`` (written back by the caller)."""
    path = directory / "manifest.json"
    raw = json.loads(path.read_text())
    series = [parse_patch(p) for p in sorted(directory.glob("[0-9][0-9][0-9][0-9]-*.patch"))]
    raw["patches"] = [
        {"id": s.patch_id, "file": s.name, "sha256": sha256_file(directory / s.name)}
        for s in series
    ]
    touched: dict[str, list[str]] = {}
    for s in series:
        for fp in s.files:
            touched.setdefault(fp.path, []).append(s.patch_id)
    files = {p: {"patches": ids, "base": {}, "result": {}} for p, ids in touched.items()}
    for name, variant in raw["variants"].items():
        wheel = ensure_wheel(Wheel(**variant["wheel"]))
        with tempfile.TemporaryDirectory() as tmp:
            site = unpack(wheel, Path(tmp))
            variant["identity"] = {f: sha256_file(site / f) for f in IDENTITY_FILES}
            texts = {p: (site / p).read_text(encoding="utf-8") for p in touched}
        for p, text in texts.items():
            files[p]["base"][name] = sha256_bytes(text.encode())
        for s in series:
            for fp in s.files:
                texts[fp.path] = apply_file_patch(texts[fp.path], fp, s.name)
        for p, text in texts.items():
            files[p]["result"][name] = sha256_bytes(text.encode())
    raw["files"] = files
    return raw
