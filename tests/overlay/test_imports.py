"""The build-time overlay machinery runs before torch or vLLM is usable: it imports neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MODULES = ["specpair.overlay", "specpair.overlay.cli", "specpair.overlay.apply_series",
           "specpair.overlay.status", "specpair.overlay.attestation", "specpair.overlay.manifest",
           "specpair.overlay.manifest_build", "specpair.overlay.wheels",
           "specpair.overlay.shadow_copy", "specpair.overlay.unified_diff",
           "specpair.overlay.errors"]


def test_the_overlay_package_and_its_cli_import_no_torch():
    code = (
        "import importlib, json, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        "from specpair.cli import build_parser\n"
        "build_parser('overlay')\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'vllm', 'transformers'))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    assert json.loads(out.stdout) == []
