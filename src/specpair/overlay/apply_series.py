"""Apply the vLLM overlay's patch series to a site-packages directory.

Apply is all-or-nothing: every base hash is checked before anything is
written, the series is applied in memory, every result hash and every patched
module's byte-compilation is checked, and only then are files replaced; any
failure while writing restores the originals. The attestation (see
``specpair.overlay.attestation``) is written last.
"""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

from specpair import __version__ as specpair_version
from specpair.overlay.attestation import Attestation, attestation_bytes, attestation_path
from specpair.overlay.errors import BaseDrift, OverlayError, ResultMismatch
from specpair.overlay.manifest import Manifest, sha256_bytes
from specpair.overlay.status import status
from specpair.overlay.unified_diff import apply_file_patch

__all__ = ["apply"]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.specpair-tmp")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def apply(site: Path, man: Manifest, exclude: tuple[str, ...] = ()) -> tuple[Attestation, bool]:
    """Apply the series (minus ``exclude``). Returns (attestation, changed).

    ``changed`` is False when the same overlay was already applied (a no-op).
    Raises BaseDrift / ResultMismatch / PatchConflict / OverlayError with the tree untouched.
    """
    exclude = tuple(sorted(set(exclude)))
    man.check_exclusion(exclude)
    st = status(site, man)
    variant = st.variant
    if st.attestation is not None:
        if st.state == "applied" and st.attestation.excluded == exclude:
            return st.attestation, False
        if st.state == "applied":
            raise OverlayError(
                f"{site} already carries {man.overlay_id} with excluded="
                f"{list(st.attestation.excluded)}; reinstall vLLM to apply it with "
                f"excluded={list(exclude)}"
            )
        raise BaseDrift(f"{site} has an attestation but drifted: " + "; ".join(st.problems))
    for path, entry in man.files.items():  # every base hash, before anything else
        got = st.files[path]
        if got != "base":
            found = entry.result[variant] if got == "result" else got.split(":", 1)[1]
            raise BaseDrift(
                f"{path}: sha256 {found}, pinned base {entry.base[variant]} ({variant}); "
                "nothing was changed"
            )
    originals = {p: (site / p).read_bytes() for p in man.files}
    texts = {p: b.decode("utf-8") for p, b in originals.items()}
    applied = tuple(s.patch_id for s in man.series if s.patch_id not in exclude)
    for s in man.series:
        if s.patch_id in exclude:
            continue
        for fp in s.files:
            texts[fp.path] = apply_file_patch(texts[fp.path], fp, s.name)
    results: dict[str, bytes] = {}
    for path, text in texts.items():
        data = text.encode("utf-8")
        want = man.expected_after(path, variant, exclude)
        got = sha256_bytes(data)
        if got != want:
            raise ResultMismatch(f"{path}: patched sha256 {got}, pinned result {want} ({variant})")
        compile(data, str(site / path), "exec", dont_inherit=True)
        if data != originals[path]:
            results[path] = data
    att = Attestation(
        overlay_id=man.overlay_id,
        vllm_version=man.vllm_version,
        variant=variant,
        specpair_version=specpair_version,
        applied=applied,
        excluded=exclude,
        files={
            p: {
                "base": man.files[p].base[variant],
                "result": man.expected_after(p, variant, exclude),
            }
            for p in man.files
        },
    )
    written: list[str] = []
    try:
        for path, data in results.items():
            _atomic_write(site / path, data)
            written.append(path)
        for path in results:
            _drop_pyc(site / path)  # stale (or, in a symlinked tree, foreign) bytecode
            py_compile.compile(
                str(site / path), doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
        _atomic_write(attestation_path(site), attestation_bytes(att))
    except BaseException:
        for path in written:
            _atomic_write(site / path, originals[path])
            _drop_pyc(site / path)
        attestation_path(site).unlink(missing_ok=True)
        raise
    return att, True


def _drop_pyc(path: Path) -> None:
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)

