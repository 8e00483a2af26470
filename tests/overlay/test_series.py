"""The patch series against the real pinned wheels: hashes, apply, re-apply, drift, restore."""

from __future__ import annotations

import importlib.util
import json
import marshal
import py_compile
from pathlib import Path

import pytest
from overlay_sites import mini_site, snapshot

from specpair.cli import main
from specpair.overlay import apply_series
from specpair.overlay.apply_series import apply
from specpair.overlay.attestation import attestation_path
from specpair.overlay.errors import (
    BadExclusion,
    BaseDrift,
    CannotWrite,
    ExclusionMismatch,
    ResultMismatch,
    WrongVllm,
)
from specpair.overlay.manifest import sha256_file
from specpair.overlay.status import detect_variant, status, verify

VARIANTS = ("cuda", "cpu")


@pytest.mark.parametrize("variant", VARIANTS)
def test_base_hashes_match_the_pinned_wheel(manifest, unpacked, variant):
    site = unpacked[variant]
    assert detect_variant(site, manifest) == variant
    for path, entry in manifest.files.items():
        assert sha256_file(site / path) == entry.base[variant], path


@pytest.mark.parametrize("variant", VARIANTS)
def test_apply_matches_every_result_hash_and_compiles(manifest, unpacked, variant, tmp_path):
    site = mini_site(manifest, unpacked[variant], tmp_path)
    att, changed = apply(site, manifest)
    assert changed and att.variant == variant and att.applied == manifest.patch_ids
    for path, entry in manifest.files.items():
        assert sha256_file(site / path) == entry.result[variant], path
        assert att.files[path] == {"base": entry.base[variant], "result": entry.result[variant]}
        py_compile.compile(str(site / path), cfile=str(tmp_path / "x.pyc"), doraise=True)
        pyc = Path(importlib.util.cache_from_source(str(site / path))).read_bytes()
        source = (site / path).read_bytes()  # a checked-hash .pyc of exactly this source
        assert pyc[:4] == importlib.util.MAGIC_NUMBER and pyc[4:8] == (3).to_bytes(4, "little")
        assert pyc[8:16] == importlib.util.source_hash(source)
        assert marshal.loads(pyc[16:]) == compile(source, str(site / path), "exec",
                                                  dont_inherit=True)
    st = verify(site, manifest)
    assert st.state == "applied" and set(st.files.values()) == {"result"}
    raw = json.loads(attestation_path(site).read_text())
    assert raw["overlay_id"] == manifest.overlay_id and raw["vllm_version"] == "0.32.0"
    assert raw["specpair_version"] and raw["excluded"] == []
    # re-applying is a no-op that says so
    before = snapshot(site)
    att2, changed2 = apply(site, manifest)
    assert not changed2 and att2 == att and snapshot(site) == before


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_changed_base_byte_is_refused_touching_nothing(manifest, unpacked, variant, tmp_path):
    site = mini_site(manifest, unpacked[variant], tmp_path)
    victim = "vllm/v1/worker/gpu/model_runner.py"
    data = bytearray((site / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (site / victim).write_bytes(bytes(data))
    before = snapshot(site)
    with pytest.raises(BaseDrift) as err:
        apply(site, manifest)
    msg = str(err.value)
    assert victim in msg and manifest.files[victim].base[variant] in msg
    assert sha256_file(site / victim) in msg
    assert snapshot(site) == before  # nothing written, no attestation
    assert status(site, manifest).state == "drifted"


def test_verify_catches_a_tampered_result(manifest, unpacked, tmp_path):
    site = mini_site(manifest, unpacked["cpu"], tmp_path)
    apply(site, manifest)
    p = site / "vllm/utils/cpu_triton_utils.py"
    p.write_text(p.read_text() + "\n# tampered\n")
    with pytest.raises(ResultMismatch, match="cpu_triton_utils.py"):
        verify(site, manifest)


def test_exclusion_is_recorded_and_checked(manifest, unpacked, tmp_path):
    site = mini_site(manifest, unpacked["cpu"], tmp_path)
    att, changed = apply(site, manifest, exclude=("0003",))
    assert changed and att.excluded == ("0003",) and "0003" not in att.applied
    f = "vllm/utils/cpu_triton_utils.py"
    assert sha256_file(site / f) == manifest.files[f].base["cpu"] == att.files[f]["result"]
    assert verify(site, manifest).state == "applied"
    with pytest.raises(ExclusionMismatch, match="already carries"):
        apply(site, manifest)  # the full series needs a fresh vLLM
    with pytest.raises(BadExclusion, match="unknown"):
        apply(site, manifest, exclude=("0999",))


def test_unknown_vllm_build_is_refused(manifest, unpacked, tmp_path):
    site = mini_site(manifest, unpacked["cpu"], tmp_path)
    (site / "vllm/_version.py").write_text("__version__ = version = '0.31.9'\n")
    with pytest.raises(WrongVllm, match="0.31.9"):
        apply(site, manifest)
    with pytest.raises(WrongVllm, match="no vllm package"):
        apply(tmp_path / "empty", manifest)


def test_failure_while_writing_restores_the_tree(manifest, unpacked, tmp_path, monkeypatch):
    site = mini_site(manifest, unpacked["cuda"], tmp_path)
    before = snapshot(site)

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(apply_series, "write_bytecode", boom)
    with pytest.raises(CannotWrite, match="simulated.*restored"):
        apply(site, manifest)
    after = {k: v for k, v in snapshot(site).items() if "__pycache__" not in k}
    assert after == before and not attestation_path(site).exists()
    assert status(site, manifest).state == "clean"


def test_cli_apply_verify_status_json(manifest, unpacked, tmp_path, capsys):
    site = mini_site(manifest, unpacked["cpu"], tmp_path)
    sp = ["--site-packages", str(site), "--json"]
    assert main(["overlay", "status", *sp]) == 0
    assert json.loads(capsys.readouterr().out)["status"]["state"] == "clean"
    assert main(["overlay", "verify", *sp]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "ResultMismatch"
    assert main(["overlay", "apply", *sp]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] and out["attestation_path"].endswith("vllm/SPECPAIR_OVERLAY.json")
    assert main(["overlay", "apply", *sp]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False
    assert main(["overlay", "verify", *sp]) == 0
    capsys.readouterr()
    (site / "vllm/config/vllm.py").write_text("x = 1\n")
    assert main(["overlay", "verify", *sp]) == 1
    assert "vllm/config/vllm.py" in capsys.readouterr().out


def test_a_wheel_that_differs_from_its_pin_is_refused(manifest, tmp_path):
    from specpair.overlay.errors import WheelHashMismatch
    from specpair.overlay.wheels import ensure_wheel

    pin = manifest.variants["cpu"].wheel
    (tmp_path / pin.filename).write_bytes(b"not the pinned wheel")
    with pytest.raises(WheelHashMismatch, match=pin.sha256):
        ensure_wheel(pin, tmp_path)
