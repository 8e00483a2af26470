"""kill -9 anywhere in `overlay apply`: a re-run completes the series and verify passes.

Sweep: ``kill_at_write.py`` runs the real CLI in a subprocess on a small site-packages laid
out from the pinned cuda wheel's base files and SIGKILLs itself at its Nth write, for every
N from 1 to the number of writes a whole apply makes (each point between two file-system
steps: the intent, each file's temporary, chmod and rename, each .pyc, the attestation).
After each kill, ``status`` is clean, partial or applied (never drifted) and a partial one
names the command that completes it; ``apply`` then ``verify`` pass, no temporary is left,
and the tree equals an uninterrupted apply's. Double kills: for every third N the
completing apply is itself killed halfway through its own writes, then completed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from overlay_sites import mini_site, snapshot

from specpair.cli import main
from specpair.overlay.apply_series import apply
from specpair.overlay.attestation import pending_path
from specpair.overlay.errors import ExclusionMismatch
from specpair.overlay.status import status, verify
from specpair.overlay.tree_writes import TEMP_SUFFIX

KILLER = Path(__file__).with_name("kill_at_write.py")
SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONDONTWRITEBYTECODE": "1"}


def _killed_apply(site: Path, n: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KILLER), str(site), str(n)], env=ENV,
                          capture_output=True, text=True, timeout=120)


def _sources(site: Path) -> dict[str, bytes]:
    """Every file but bytecode (checked separately: its marshal bytes may vary by process)."""
    return {k: v for k, v in snapshot(site).items() if "__pycache__" not in k}


def _leftovers(site: Path) -> list[str]:
    return [str(p) for p in site.rglob("*")
            if p.name.endswith(TEMP_SUFFIX) or p == pending_path(site)]


def test_kill_at_every_write_then_apply_completes(manifest, unpacked, tmp_path):
    base = unpacked["cuda"]
    ref = mini_site(manifest, base, tmp_path / "ref")
    pristine = _sources(ref)
    run = _killed_apply(ref, 0)  # no kill: count the writes of a whole apply
    assert run.returncode == 0, run.stderr
    writes = int(run.stderr.split("writes ")[-1])
    want = _sources(ref)
    seen: set[str] = set()
    points = 0
    for n in range(1, writes + 1):
        site = mini_site(manifest, base, tmp_path / f"k{n}")
        run = _killed_apply(site, n)
        assert run.returncode == -signal.SIGKILL, (n, run.stderr[-500:])
        points += 1
        st = status(site, manifest)
        seen.add(st.state + ("+leftovers" if st.strays else ""))
        assert st.state in ("clean", "partial", "applied"), (n, st.problems)
        if st.state == "partial":
            assert f"specpair overlay apply --site-packages {site}" in st.advice
        if st.state == "clean" and not st.strays:
            assert _sources(site) == pristine, n  # killed before the first write: pristine
        if n % 3 == 1:  # kill the completing apply too, halfway through what it has left
            again = _killed_apply(site, max(1, (writes - n) // 2))
            assert again.returncode in (0, -signal.SIGKILL), (n, again.stderr[-500:])
            points += again.returncode != 0
            assert status(site, manifest).state in ("clean", "partial", "applied"), n
        apply(site, manifest)
        assert verify(site, manifest).state == "applied"
        assert not _leftovers(site), (n, _leftovers(site))
        assert _sources(site) == want, n
        shutil.rmtree(site)
    assert points >= 50, points  # 39 single kills + 13 double kills on vLLM 0.32.0 cuda
    assert {"clean", "clean+leftovers", "partial", "partial+leftovers"} <= seen, seen


def test_status_says_how_to_complete_an_interrupted_apply(manifest, unpacked, tmp_path, capsys):
    site = mini_site(manifest, unpacked["cuda"], tmp_path)
    assert _killed_apply(site, 9).returncode == -signal.SIGKILL  # mid-series
    assert main(["overlay", "status", "--site-packages", str(site)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("partial (cuda)")
    assert ("next: an apply was interrupted (" in err
            and f"run `specpair overlay apply --site-packages {site}` to complete it" in err)
    assert main(["overlay", "verify", "--site-packages", str(site)]) == 1
    assert "partial" in capsys.readouterr().err
    assert main(["overlay", "apply", "--site-packages", str(site)]) == 0
    assert main(["overlay", "verify", "--site-packages", str(site)]) == 0


def test_a_half_patched_tree_without_a_readable_intent_is_completed(manifest, unpacked,
                                                                     tmp_path):
    """Files at their pinned result but no usable record of an apply (what a kill left under
    older specpair, which wrote no intent; or an intent file damaged since): partial, the
    damaged intent is a leftover, and apply completes the series."""
    done = mini_site(manifest, unpacked["cpu"], tmp_path / "done")
    apply(done, manifest)
    site = mini_site(manifest, unpacked["cpu"], tmp_path / "half")
    for p in list(manifest.files)[:2]:
        shutil.copy2(done / p, site / p)
    (site / "vllm/utils/.cpu_triton_utils.py.specpair-tmp").write_bytes(b"half a write")
    pending_path(site).write_text('{"overlay_id": ')
    st = status(site, manifest)
    assert st.state == "partial" and st.pending is None
    assert set(st.strays) == {"vllm/utils/.cpu_triton_utils.py.specpair-tmp",
                              "vllm/SPECPAIR_OVERLAY.pending.json"}
    apply(site, manifest)
    assert verify(site, manifest).state == "applied" and not _leftovers(site)


@pytest.mark.parametrize("exclude", [(), ("0003",)])
def test_an_interrupted_apply_completes_only_with_its_own_exclusions(manifest, unpacked,
                                                                      tmp_path, exclude):
    site = mini_site(manifest, unpacked["cpu"], tmp_path)
    apply(site, manifest, exclude)  # then undo the attestation: as if killed before step 4
    (site / "vllm/SPECPAIR_OVERLAY.json").rename(pending_path(site))
    st = status(site, manifest)
    assert st.state == "partial" and st.pending.excluded == exclude
    other = () if exclude else ("0003",)
    flags = "".join(f" --exclude {p}" for p in exclude)
    assert st.advice.endswith(f"--site-packages {site}{flags}` to complete it")
    if not exclude:  # 0003's file is patched: an apply leaving it out cannot complete this
        with pytest.raises(ExclusionMismatch, match="completes only with its own exclusions"):
            apply(site, manifest, other)
    att, changed = apply(site, manifest, exclude)
    assert changed and att.excluded == exclude and verify(site, manifest).state == "applied"
