"""The unified-diff applier: exact hunks, offsets, hard failure on conflict or bad format."""

from __future__ import annotations

import pytest

from specpair.overlay.errors import PatchConflict, PatchFormatError
from specpair.overlay.unified_diff import apply_file_patch, parse_patch

BASE = "".join(f"line {i}\n" for i in range(1, 21))

PATCH = """what: change line 3 and line 15
why: a test

--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -2,3 +2,3 @@
 line 2
-line 3
+LINE THREE
 line 4
@@ -14,3 +14,4 @@
 line 14
 line 15
+inserted
 line 16
"""


def _write(tmp_path, text, name="0001-test.patch"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_parse_and_apply(tmp_path):
    series = parse_patch(_write(tmp_path, PATCH))
    assert series.patch_id == "0001" and "why: a test" in series.header
    (fp,) = series.files
    assert fp.path == "pkg/mod.py" and len(fp.hunks) == 2
    out = apply_file_patch(BASE, fp, "t")
    assert "LINE THREE\nline 4\n" in out and "line 15\ninserted\nline 16\n" in out
    assert "line 3\n" not in out and out.count("\n") == 21


def test_hunk_at_an_offset_still_applies_exactly(tmp_path):
    (fp,) = parse_patch(_write(tmp_path, PATCH)).files
    shifted = "extra 1\nextra 2\n" + BASE
    out = apply_file_patch(shifted, fp, "t")
    assert out.startswith("extra 1\nextra 2\nline 1\nline 2\nLINE THREE\n")


def test_conflict_fails_hard(tmp_path):
    (fp,) = parse_patch(_write(tmp_path, PATCH)).files
    with pytest.raises(PatchConflict, match="hunk 1"):
        apply_file_patch(BASE.replace("line 3\n", "line three\n"), fp, "t")
    with pytest.raises(PatchConflict, match="hunk 2"):
        apply_file_patch(BASE.replace("line 15\n", "line 15 changed\n"), fp, "t")


@pytest.mark.parametrize(("text", "match"), [
    (PATCH.split("--- a")[0], "no file diffs"),
    ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "missing header"),
    ("h\n--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n", "renames"),
    ("h\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n", "ends early"),
    ("h\n--- a/x\n+++ b/x\n@@ bad @@\n", "bad hunk header"),
    ("h\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n?a\n", "bad hunk line"),
])
def test_malformed_patches_are_refused(tmp_path, text, match):
    with pytest.raises(PatchFormatError, match=match):
        parse_patch(_write(tmp_path, text))


def test_patch_names_are_numbered(tmp_path):
    with pytest.raises(PatchFormatError, match="NNNN"):
        parse_patch(_write(tmp_path, PATCH, name="fix.patch"))


def test_no_newline_at_end_of_file(tmp_path):
    text = "h\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n"
    (fp,) = parse_patch(_write(tmp_path, text)).files
    assert apply_file_patch("a", fp, "t") == "b\n"
