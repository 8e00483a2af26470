"""The target's specpair settings: the environment variables the V1 proposer and the V2
speculator read (overlays/vllm/0.32.0/README.md), parsed and checked in one place.

``check(env, depth)`` names the first bad value on one line (``BadTargetSetting``, exit 4).
The proposer and the speculator call it in their constructors, so a bad value stops the
engine at its start with that line as the reason, not at its first request; ``specpair
deploy`` calls it on the inventory's target environment before Ansible starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specpair.errors import BadInput
from specpair.vllm.policy_setting import ENV as DEPTH_POLICY
from specpair.vllm.policy_setting import PolicySetting, parse_setting

__all__ = ["BadTargetSetting", "DEADLINE", "DEPTH_POLICY", "DRAFTER", "FEATURES", "KEY_FILE",
           "NGRAM", "NGRAM_DEFAULT", "NGRAM_OFF", "check", "deadline_s", "depth_policy",
           "drafter", "features", "ngram", "ngram_adaptive"]

DRAFTER = "SPECPAIR_DRAFTER"  # HOST:PORT of the drafter, or inproc:MODEL_DIR
KEY_FILE = "SPECPAIR_DRAFTER_KEY_FILE"  # the wire's shared key (HOST:PORT only)
DEADLINE = "SPECPAIR_DRAFT_DEADLINE_MS"  # per-step deadline of a PROPOSE round
FEATURES = "SPECPAIR_DRAFT_FEATURES"  # KIND:DTYPE:WIDTH of the hidden states the drafter asks
NGRAM = "SPECPAIR_NGRAM"  # MIN:MAX n-gram lengths of the n-gram lookup (specpair.vllm.ngram)
NGRAM_DEFAULT = (5, 5)  # vLLM's prompt_lookup_min / prompt_lookup_max when neither is given
NGRAM_MAX = 64  # longer n-grams would only cost lookup time
NGRAM_OFF = "off"  # SPECPAIR_NGRAM=off: adaptive never chooses n-gram drafts
DEFAULT_DEADLINE_MS = 200.0
MAX_DEADLINE_MS = 60_000.0
FEATURE_KINDS = ("LAST_HIDDEN", "AUX_POOLED")  # specpair.wire.frames.FeatureKind's names
FEATURE_DTYPES = ("float32", "float16", "bfloat16")


class BadTargetSetting(BadInput):
    """A specpair environment variable of the target has a value outside its contract."""


def deadline_s(env: Mapping[str, str]) -> float:
    text = env.get(DEADLINE, "")
    if not text:
        return DEFAULT_DEADLINE_MS / 1000.0
    try:
        ms = float(text)
    except ValueError:
        ms = math.nan
    if not 0 < ms <= MAX_DEADLINE_MS:
        raise BadTargetSetting(f"{DEADLINE}={text[:40]!r}: expected milliseconds in "
                               f"(0, {MAX_DEADLINE_MS:g}] (default {DEFAULT_DEADLINE_MS:g})")
    return ms / 1000.0


def features(env: Mapping[str, str]) -> tuple[str, str, int] | None:
    """(kind, dtype name, width) of SPECPAIR_DRAFT_FEATURES, or None when unset."""
    text = env.get(FEATURES, "")
    if not text:
        return None
    parts = text.split(":")
    if (len(parts) == 3 and parts[0].upper() in FEATURE_KINDS and parts[1] in FEATURE_DTYPES
            and parts[2].isdigit() and int(parts[2]) > 0):
        return parts[0].upper(), parts[1], int(parts[2])
    raise BadTargetSetting(f"{FEATURES}={text[:60]!r}: expected KIND:DTYPE:WIDTH with KIND in "
                           f"{', '.join(FEATURE_KINDS)}, DTYPE in {', '.join(FEATURE_DTYPES)} "
                           "and WIDTH a positive integer (e.g. LAST_HIDDEN:bfloat16:7168)")


def drafter(env: Mapping[str, str]) -> tuple[str, Any] | None:
    """("inproc", model dir) or ("wire", (host, port, key file)) of SPECPAIR_DRAFTER, or None
    when unset (no drafter: every step target-only)."""
    where = env.get(DRAFTER, "")
    if not where:
        return None
    if where.startswith("inproc:"):
        if not where.removeprefix("inproc:"):
            raise BadTargetSetting(f"{DRAFTER}={where!r}: inproc: needs the draft model's "
                                   "directory")
        return "inproc", where.removeprefix("inproc:")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadTargetSetting(f"{DRAFTER}={where[:80]!r}: expected HOST:PORT (port 1..65535) "
                               "or inproc:MODEL_DIR")
    key_file = env.get(KEY_FILE, "")
    if not key_file:
        raise BadTargetSetting(f"{KEY_FILE} is not set (the wire's shared key file; "
                               f"{DRAFTER} names a drafter at {where[:80]})")
    return "wire", (host, int(port), key_file)


def depth_policy(env: Mapping[str, str], k_max: int) -> PolicySetting:
    try:
        return parse_setting(env.get(DEPTH_POLICY, "adaptive"), k_max)
    except ValueError as e:
        raise BadTargetSetting(str(e)) from None


def ngram(env: Mapping[str, str]) -> tuple[int, int]:
    """(MIN, MAX) n-gram lengths of the n-gram lookup (SPECPAIR_NGRAM; default 5:5, also with
    ``off``, which only keeps ``adaptive`` from choosing them: ngram_adaptive)."""
    text = env.get(NGRAM, "")
    if not text or text.strip() == NGRAM_OFF:
        return NGRAM_DEFAULT
    lo, sep, hi = text.partition(":")
    if sep and lo.strip().isdigit() and hi.strip().isdigit() \
            and 1 <= int(lo) <= int(hi) <= NGRAM_MAX:
        return int(lo), int(hi)
    raise BadTargetSetting(f"{NGRAM}={text[:40]!r}: expected MIN:MAX n-gram lengths with "
                           f"1 <= MIN <= MAX <= {NGRAM_MAX} (default "
                           f"{NGRAM_DEFAULT[0]}:{NGRAM_DEFAULT[1]}), or {NGRAM_OFF}")


def ngram_adaptive(env: Mapping[str, str]) -> bool:
    """Whether the ``adaptive`` depth policy may choose n-gram drafts: unless
    SPECPAIR_NGRAM=off (requests pinned to a setting with ``n`` rounds take them anyway)."""
    return env.get(NGRAM, "").strip() != NGRAM_OFF


def check(env: Mapping[str, str], depth: int) -> None:
    """Raise BadTargetSetting naming the first bad specpair setting in ``env`` for a target
    whose speculative config drafts up to ``depth`` tokens."""
    drafter(env)
    deadline_s(env)
    features(env)
    depth_policy(env, depth)
    ngram(env)
