"""The attestation: what an apply did, as JSON inside the patched vLLM.

``<site-packages>/vllm/SPECPAIR_OVERLAY.json`` (inside the vllm package, so it
travels with it); ``verify`` and the attestation gate re-check it against the files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ATTESTATION_NAME", "Attestation", "attestation_path", "read_attestation",
           "attestation_bytes"]

ATTESTATION_NAME = "SPECPAIR_OVERLAY.json"  # inside <site-packages>/vllm/


@dataclass(frozen=True)
class Attestation:
    """What an apply did; written as JSON next to the patched vLLM."""

    overlay_id: str  # manifest overlay_id
    vllm_version: str  # e.g. "0.32.0"
    variant: str  # "cuda" or "cpu"
    specpair_version: str  # the specpair that applied it
    applied: tuple[str, ...]  # patch ids applied, in order
    excluded: tuple[str, ...]  # patch ids left out (power tests only)
    files: dict[str, dict[str, str]]  # path -> {"base": sha256, "result": sha256}


def attestation_path(site: Path) -> Path:
    return site / "vllm" / ATTESTATION_NAME


def read_attestation(site: Path) -> Attestation | None:
    path = attestation_path(site)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw["applied"] = tuple(raw["applied"])
    raw["excluded"] = tuple(raw["excluded"])
    return Attestation(**raw)


def attestation_bytes(att: Attestation) -> bytes:
    return (json.dumps(asdict(att), indent=2) + "\n").encode()
