"""Helpers for the image tests: load the script modules of images/bin/ and scripts/ (they are not
a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(relpath: str) -> ModuleType:
    """Import the script at RELPATH (from the repository root) as a module."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(f"_specpair_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def image_lock() -> ModuleType:
    return load_script("images/bin/image_lock.py")


@pytest.fixture(scope="session")
def gates_report() -> ModuleType:
    return load_script("images/bin/image_gates_report.py")


@pytest.fixture(scope="session")
def pair_report() -> ModuleType:
    return load_script("scripts/local_pair_report.py")
