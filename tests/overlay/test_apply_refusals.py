"""What `overlay apply` refuses, each as one line and a documented exit code, nothing written:
a directory whose symlink leads outside --site-packages, a read-only tree, another vLLM, a
broken overlay directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from overlay_sites import mini_site, snapshot

from specpair.cli import main
from specpair.overlay.apply_series import apply
from specpair.overlay.cli import EXIT_BAD_OVERLAY, EXIT_CANNOT_WRITE, EXIT_WRONG_VLLM
from specpair.overlay.errors import OutsideSite
from specpair.overlay.shadow_copy import shadow_copy
from specpair.overlay.status import verify

SRC = Path(__file__).resolve().parents[2] / "src"


def _one_line_error(err: str, kind: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {kind}: "), err
    assert "Traceback" not in err
    return lines[0]


def test_a_symlinked_directory_leading_outside_is_refused(manifest, unpacked, tmp_path, capsys):
    site = mini_site(manifest, unpacked["cpu"], tmp_path / "site")
    elsewhere = tmp_path / "elsewhere"
    shutil.move(site / "vllm/utils", elsewhere)
    (site / "vllm/utils").symlink_to(elsewhere)
    outside, inside = snapshot(elsewhere), snapshot(site)
    with pytest.raises(OutsideSite, match="vllm/utils resolves to .*elsewhere, outside"):
        apply(site, manifest)
    code = main(["overlay", "apply", "--site-packages", str(site)])
    assert code == EXIT_CANNOT_WRITE == 4
    line = _one_line_error(capsys.readouterr().err, "OutsideSite")
    assert "nothing was changed" in line
    assert snapshot(elsewhere) == outside and not (elsewhere / "__pycache__").exists()
    assert snapshot(site) == inside


def test_a_symlinked_directory_inside_and_symlinked_files_are_fine(manifest, unpacked, tmp_path):
    """Shadow copies (files symlinked to the original install) get real files; the original
    is never written. A directory symlink that stays inside the tree is allowed."""
    original = mini_site(manifest, unpacked["cpu"], tmp_path / "original")
    before = snapshot(original)
    copy = shadow_copy(original, tmp_path / "copy")
    shutil.move(copy / "vllm/utils", copy / "vllm/utils-real")
    (copy / "vllm/utils").symlink_to("utils-real")
    apply(copy, manifest)
    assert verify(copy, manifest).state == "applied"
    assert snapshot(original) == before


def test_a_read_only_tree_is_one_line_and_exit_4(manifest, unpacked, tmp_path):
    """The tree's directories are chmod a-w; root runs apply without CAP_DAC_OVERRIDE (which
    would let it write anyway), through util-linux's setpriv."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set", "-dac_override", "--"]
    site = mini_site(manifest, unpacked["cpu"], tmp_path / "site")
    dirs = [d for d, _, _ in os.walk(site)]
    for d in dirs:
        os.chmod(d, 0o555)
    try:
        before = snapshot(site)
        run = subprocess.run([*prefix, sys.executable, "-m", "specpair", "overlay", "apply",
                              "--site-packages", str(site)], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(SRC),
                                               "PYTHONDONTWRITEBYTECODE": "1"})
        assert run.returncode == EXIT_CANNOT_WRITE == 4, run.stderr
        line = _one_line_error(run.stderr, "CannotWrite")
        assert "read-only or not this user's" in line and "nothing was changed" in line
        assert snapshot(site) == before
    finally:
        for d in dirs:
            os.chmod(d, 0o755)


def test_another_vllm_version_is_named_cleanly(manifest, unpacked, tmp_path, capsys):
    site = mini_site(manifest, unpacked["cpu"], tmp_path)
    version = site / "vllm/_version.py"  # the real file's layout (__all__ names come first)
    version.write_text(version.read_text().replace("'0.32.0'", "'0.33.0'").replace(
        "(0, 32, 0)", "(0, 33, 0)"))
    before = snapshot(site)
    assert main(["overlay", "apply", "--site-packages", str(site)]) == EXIT_WRONG_VLLM == 4
    line = _one_line_error(capsys.readouterr().err, "WrongVllm")
    assert line.endswith(f"{site}/vllm is vLLM 0.33.0; this overlay fits vLLM 0.32.0 only "
                         "(builds cpu, cuda)")
    assert main(["overlay", "status", "--site-packages", str(site)]) == EXIT_WRONG_VLLM
    capsys.readouterr()
    assert snapshot(site) == before


def test_a_broken_overlay_directory_is_exit_5(manifest, unpacked, tmp_path, capsys):
    site = mini_site(manifest, unpacked["cpu"], tmp_path / "site")
    empty, broken = tmp_path / "empty", tmp_path / "broken"
    empty.mkdir()
    shutil.copytree(manifest.directory, broken)
    (broken / "manifest.json").write_text('{"patches": [')
    for overlay, kind in ((empty, "BadOverlay"), (broken, "BadOverlay")):
        code = main(["overlay", "apply", "--site-packages", str(site), "--overlay", str(overlay)])
        assert code == EXIT_BAD_OVERLAY == 5
        _one_line_error(capsys.readouterr().err, kind)
    patch = next(broken.glob("0001-*.patch"))
    shutil.copy2(manifest.directory / "manifest.json", broken / "manifest.json")
    patch.write_text(patch.read_text() + "\n")  # no longer the pinned patch file
    assert main(["overlay", "verify", "--site-packages", str(site), "--overlay", str(broken),
                 "--json"]) == EXIT_BAD_OVERLAY
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "BadOverlay" and "the manifest pins" in out["message"]
