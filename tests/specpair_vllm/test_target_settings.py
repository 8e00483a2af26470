"""The target's specpair settings (specpair.vllm.settings): documented values accepted, a bad
one named on one line, and the proposer/speculator refusing it at engine start."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specpair.vllm import settings
from specpair.vllm.settings import BadTargetSetting, check
from specpair.wire.frames import FeatureKind

GOOD = {"SPECPAIR_DRAFTER": "10.0.0.2:7420", "SPECPAIR_DRAFTER_KEY_FILE": "/run/key",
        "SPECPAIR_DRAFT_DEADLINE_MS": "150", "SPECPAIR_DEPTH_POLICY": "schedule:3,0,1",
        "SPECPAIR_DRAFT_FEATURES": "LAST_HIDDEN:bfloat16:7168"}


def test_documented_values_are_accepted_and_parsed():
    check(GOOD, 3)
    check({}, 3)  # every setting has a default; no drafter: target-only
    check({"SPECPAIR_DRAFTER": "inproc:/models/draft"}, 1)
    assert settings.deadline_s(GOOD) == pytest.approx(0.150)
    assert settings.deadline_s({}) == pytest.approx(0.200)
    assert settings.drafter(GOOD) == ("wire", ("10.0.0.2", 7420, "/run/key"))
    assert settings.features(GOOD) == ("LAST_HIDDEN", "bfloat16", 7168)
    assert settings.depth_policy(GOOD, 3).schedule == (3, 0, 1)
    assert set(settings.FEATURE_KINDS) == {k.name for k in FeatureKind}


@pytest.mark.parametrize(("key", "value", "what"), [
    ("SPECPAIR_DEPTH_POLICY", "fastest", "expected adaptive, off, fixed, fixed:K[g|n] or schedule"),
    ("SPECPAIR_DEPTH_POLICY", "fixed:4", "depths must be integers in 0..3"),
    ("SPECPAIR_DEPTH_POLICY", "fixed:3x", "an optional g (greedy drafts) or n (n-gram drafts)"),
    ("SPECPAIR_NGRAM", "4:2", "expected MIN:MAX n-gram lengths"),
    ("SPECPAIR_DRAFT_DEADLINE_MS", "0", "expected milliseconds in (0, 60000]"),
    ("SPECPAIR_DRAFT_DEADLINE_MS", "nan", "expected milliseconds"),
    ("SPECPAIR_DRAFT_DEADLINE_MS", "2e9", "expected milliseconds"),
    ("SPECPAIR_DRAFTER", "drafter.lan", "expected HOST:PORT (port 1..65535) or inproc:"),
    ("SPECPAIR_DRAFTER", "h:70000", "expected HOST:PORT"),
    ("SPECPAIR_DRAFTER", "inproc:", "inproc: needs the draft model's directory"),
    ("SPECPAIR_DRAFT_FEATURES", "LAST_HIDDEN:int8:7168", "expected KIND:DTYPE:WIDTH"),
    ("SPECPAIR_DRAFT_FEATURES", "LAST_HIDDEN:bfloat16:-1", "expected KIND:DTYPE:WIDTH"),
])
def test_a_bad_value_is_named_on_one_line(key, value, what):
    with pytest.raises(BadTargetSetting) as e:
        check({**GOOD, key: value}, 3)
    assert str(e.value).startswith(f"{key}=") and what in str(e.value)
    assert "\n" not in str(e.value)


def test_a_wire_drafter_without_its_key_file_is_refused():
    with pytest.raises(BadTargetSetting, match="SPECPAIR_DRAFTER_KEY_FILE is not set"):
        check({"SPECPAIR_DRAFTER": "127.0.0.1:7420"}, 3)


def _cfg(depth=3):
    spec = SimpleNamespace(num_speculative_tokens=depth, rejection_sample_method="standard",
                           enable_adaptive_verification=False)
    model = SimpleNamespace(get_vocab_size=lambda: 16, max_model_len=64, tokenizer="unused")
    return SimpleNamespace(speculative_config=spec, model_config=model,
                           scheduler_config=SimpleNamespace(max_num_seqs=4))


def test_the_v1_proposer_refuses_a_bad_setting_at_engine_start(monkeypatch):
    from specpair.vllm.v1 import RemoteProposer

    monkeypatch.setenv("SPECPAIR_DRAFT_DEADLINE_MS", "-5")
    with pytest.raises(BadTargetSetting, match="SPECPAIR_DRAFT_DEADLINE_MS='-5'"):
        RemoteProposer(_cfg())
