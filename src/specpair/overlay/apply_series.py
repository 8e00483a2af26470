"""Apply the vLLM overlay's patch series to a site-packages directory, crash-safely.

Before anything is written: the build is identified, every touched file must be at its
pinned base or (an interrupted apply) at its pinned result, the series is applied in
memory to the files still at base, every result hash is checked and every patched module
compiled, and every directory to write must resolve inside --site-packages and be
writable. Then, in this order:

1. the intent: the attestation to be, as ``vllm/SPECPAIR_OVERLAY.pending.json``;
2. each file still at base replaced by its result (temp + fsync + rename);
3. every patched module's bytecode written (checked-hash .pyc; stale ones dropped);
4. the intent renamed onto ``vllm/SPECPAIR_OVERLAY.json``: the attestation comes last.

A kill at any point leaves each file at its base or its result, maybe a stray temporary,
and no attestation: ``status`` says "partial" and a re-run of ``apply`` removes the
temporaries and completes the series. A failure that raises (disk full, ...) restores the
files this run wrote.
"""

from __future__ import annotations

from pathlib import Path
from types import CodeType

from specpair import __version__ as specpair_version
from specpair.overlay.attestation import (
    Attestation,
    attestation_bytes,
    attestation_path,
    pending_path,
)
from specpair.overlay.errors import BaseDrift, CannotWrite, ExclusionMismatch, ResultMismatch
from specpair.overlay.manifest import Manifest, sha256_bytes
from specpair.overlay.status import Status, status
from specpair.overlay.tree_writes import (
    check_tree,
    drop_bytecode,
    rename_atomic,
    write_atomic,
    write_bytecode,
)
from specpair.overlay.unified_diff import apply_file_patch

__all__ = ["apply"]


def _refuse_unless_resumable(site: Path, man: Manifest, st: Status,
                             exclude: tuple[str, ...]) -> None:
    """Raise unless every file is at its base or at its result for ``exclude``."""
    if st.state == "drifted":
        unknown = [(p, v) for p, v in st.files.items() if v.startswith("unknown:")]
        if st.attestation is not None or not unknown:
            raise BaseDrift(f"{site} drifted: {'; '.join(st.problems)}; nothing was changed; "
                            f"{st.advice}")
        path, got = unknown[0]
        raise BaseDrift(f"{path}: sha256 {got.split(':', 1)[1]}, pinned base "
                        f"{man.files[path].base[st.variant]} ({st.variant}); nothing was "
                        f"changed; {st.advice}")
    for path, got in st.files.items():
        if got == "result" and man.expected_after(path, st.variant, exclude) == man.files[
                path].base[st.variant]:
            was = list(st.pending.excluded) if st.pending else "unknown"
            raise ExclusionMismatch(
                f"{path} is patched but --exclude {list(exclude)} leaves it at base: an "
                f"interrupted apply (excluded {was}) completes only with its own exclusions; "
                "nothing was changed")


def _compiled(site: Path, path: str, data: bytes) -> CodeType:
    return compile(data, str(site / path), "exec", dont_inherit=True)


def _results(site: Path, man: Manifest, st: Status,
             exclude: tuple[str, ...]) -> dict[str, tuple[bytes, CodeType]]:
    """path -> (patched bytes, code), for every file still at base that the series changes."""
    out: dict[str, tuple[bytes, CodeType]] = {}
    for path, entry in man.files.items():
        want = man.expected_after(path, st.variant, exclude)
        if want == entry.base[st.variant] or st.files[path] == "result":
            continue
        text = (site / path).read_bytes().decode("utf-8")
        for s in man.series:
            if s.patch_id in exclude:
                continue
            for fp in s.files:
                if fp.path == path:
                    text = apply_file_patch(text, fp, s.name)
        data = text.encode("utf-8")
        got = sha256_bytes(data)
        if got != want:
            raise ResultMismatch(f"{path}: patched sha256 {got}, pinned result {want} "
                                 f"({st.variant})")
        out[path] = data, _compiled(site, path, data)
    return out


def apply(site: Path, man: Manifest, exclude: tuple[str, ...] = ()) -> tuple[Attestation, bool]:
    """Apply the series (minus ``exclude``), or complete an interrupted apply.

    Returns (attestation, changed); ``changed`` is False when the same overlay was
    already applied (a no-op, apart from removing an interrupted apply's leftovers).
    Refusals (BaseDrift, ExclusionMismatch, ResultMismatch, PatchConflict, CannotWrite,
    OutsideSite) leave the tree untouched.
    """
    exclude = tuple(sorted(set(exclude)))
    man.check_exclusion(exclude)
    st = status(site, man)
    records = [f"vllm/{attestation_path(site).name}", f"vllm/{pending_path(site).name}"]
    dirs = sorted({str(Path(p).parent) for p in [*man.files, *records]})
    if st.state == "applied":
        if st.attestation.excluded != exclude:
            raise ExclusionMismatch(
                f"{site} already carries {man.overlay_id} with excluded="
                f"{list(st.attestation.excluded)}; reinstall vLLM to apply it with "
                f"excluded={list(exclude)}")
        if st.strays:
            check_tree(site, dirs)
            _remove(site, st.strays)
        return st.attestation, False
    _refuse_unless_resumable(site, man, st, exclude)
    results = _results(site, man, st, exclude)
    check_tree(site, dirs)
    att = Attestation(
        overlay_id=man.overlay_id,
        vllm_version=man.vllm_version,
        variant=st.variant,
        specpair_version=specpair_version,
        applied=tuple(s.patch_id for s in man.series if s.patch_id not in exclude),
        excluded=exclude,
        files={p: {"base": man.files[p].base[st.variant],
                   "result": man.expected_after(p, st.variant, exclude)} for p in man.files},
    )
    patched = [p for p in man.files if att.files[p]["result"] != att.files[p]["base"]]
    originals = {p: (site / p).read_bytes() for p in results}
    written: list[str] = []
    try:
        _remove(site, st.strays)
        write_atomic(pending_path(site), attestation_bytes(att))  # 1. the intent
        for path, (data, _) in results.items():  # 2. the files still at base
            write_atomic(site / path, data)
            written.append(path)
        for path in patched:  # 3. bytecode of every patched module
            data, code = results.get(path) or _resumed(site, path)
            write_bytecode(site / path, data, code)
        rename_atomic(pending_path(site), attestation_path(site))  # 4. the attestation, last
    except BaseException as err:
        _restore(site, st, originals, written, err)
        raise
    return att, True


def _resumed(site: Path, path: str) -> tuple[bytes, CodeType]:
    """A file an interrupted apply already patched (its pinned result): bytes and code."""
    data = (site / path).read_bytes()
    return data, _compiled(site, path, data)


def _remove(site: Path, leftovers: tuple[str, ...]) -> None:
    for rel in leftovers:
        (site / rel).unlink(missing_ok=True)


def _restore(site: Path, st: Status, originals: dict[str, bytes], written: list[str],
             err: BaseException) -> None:
    """Put back what this run wrote; an OSError becomes CannotWrite saying where things stand."""
    try:
        for path in written:
            write_atomic(site / path, originals[path])
            drop_bytecode(site / path)
        if st.state == "clean":
            pending_path(site).unlink(missing_ok=True)
        where = "the files this run wrote were restored"
    except OSError as again:
        where = (f"restoring failed too ({again.strerror or again}); `specpair overlay status "
                 f"--site-packages {site}` says where it stands")
    if isinstance(err, OSError):
        raise CannotWrite(f"writing into {site} failed ({err.strerror or err}"
                          f"{': ' + str(err.filename) if err.filename else ''}); {where}") from err
