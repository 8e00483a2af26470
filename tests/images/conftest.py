"""Helpers for the image tests: load the scripts/ modules (they are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py as a module."""
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_specpair_scripts_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def image_lock() -> ModuleType:
    return load_script("image_lock")


@pytest.fixture(scope="session")
def gates_report() -> ModuleType:
    return load_script("image_gates_report")


@pytest.fixture(scope="session")
def pair_report() -> ModuleType:
    return load_script("local_pair_report")
