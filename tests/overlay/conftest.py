"""Fixtures of the overlay tests: the pinned wheels (downloaded once, cached), unpacked.

The wheels come from the cache (SPECPAIR_WHEEL_CACHE or ~/.cache/specpair/wheels)
or are fetched with `pip download` on first use; both are checked against the
manifest's sha256.
"""

from __future__ import annotations

import pytest

from specpair.overlay.manifest import load_manifest
from specpair.overlay.wheels import ensure_wheel, unpack


@pytest.fixture(scope="session")
def manifest():
    return load_manifest()


@pytest.fixture(scope="session")
def unpacked(manifest, tmp_path_factory):
    """variant -> a site-packages dir holding that wheel's vllm/*.py (read-only use)."""
    out = {}
    for name, variant in manifest.variants.items():
        wheel = ensure_wheel(variant.wheel)
        out[name] = unpack(wheel, tmp_path_factory.mktemp(f"wheel-{name}"))
    return out
