"""Fixtures shared across test folders.

Nothing here imports torch at module level: the in-image gates load this file too, and in the
gb10 image under qemu importing torch kills the process (images/README.md, "Hardware
profiles"), which took the attestation gate down with it.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory):
    """The default tiny pair (seed 0), generated once per session (a TinyPair)."""
    from specpair.models.tiny import make_tiny  # transformers: only where a test asks

    return make_tiny(Path(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run a test's tiny models on one torch thread (restored after each test): a
    128-wide model gains nothing from more, and on a busy 2-core machine extra OpenMP
    threads spin (measured: the acceptance test took 66 s with 2 threads, 5 s with 1)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of Prometheus' promtool: on PATH or beside this interpreter (scripts/bootstrap.sh
    puts Debian's there); the test is skipped, saying so, where it is absent."""
    import shutil
    import sys

    here = str(Path(sys.executable).parent)
    found = shutil.which("promtool") or shutil.which("promtool", path=here)
    if found is None:
        pytest.skip("promtool is not installed (scripts/bootstrap.sh puts Debian's promtool "
                    "into the venv)")
    return found


@pytest.fixture(scope="session")
def manifest():
    """The vLLM overlay's manifest (overlays/vllm/0.32.0/manifest.json)."""
    from specpair.overlay.manifest import load_manifest

    return load_manifest()


@pytest.fixture(scope="session")
def unpacked(manifest, tmp_path_factory: pytest.TempPathFactory):
    """variant -> a site-packages dir holding that pinned wheel's vllm/*.py (read-only use);
    for the overlay tests (tests/overlay) and the V2 verifier under the Triton interpreter
    (tests/specpair_vllm). The wheels come from the cache (SPECPAIR_WHEEL_CACHE or
    ~/.cache/specpair/wheels) or are fetched with `pip download` on first use; both are
    checked against the manifest's sha256."""
    from specpair.overlay.wheels import ensure_wheel, unpack

    out = {}
    for name, variant in manifest.variants.items():
        wheel = ensure_wheel(variant.wheel)
        out[name] = unpack(wheel, tmp_path_factory.mktemp(f"wheel-{name}"))
    return out
