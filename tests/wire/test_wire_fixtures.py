"""Attack fixtures (tests/wire/fixtures): each frame gets its own specific refusal.

The fixtures are written by fixtures/make_fixtures.py; see its manifest.json for
what each one breaks. The two valid_* controls must decode, so a fixture fails
because of its one defect, not because the base frame is broken.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specpair.wire import errors as E
from specpair.wire.codec import decode

HERE = Path(__file__).parent / "fixtures"
MANIFEST = json.loads((HERE / "manifest.json").read_text())


def _generator():
    spec = importlib.util.spec_from_file_location("make_fixtures", HERE / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture(name):
    entry = MANIFEST[name]
    data = (HERE / f"{name}.bin").read_bytes()
    hello = GEN.HELLOS[entry["hello"]]
    if entry["error"] is None:
        decode(data, hello, authenticated=entry["authenticated"])
        return
    cls = getattr(E, entry["error"])
    with pytest.raises(E.WireError) as info:
        decode(data, hello, authenticated=entry["authenticated"])
    assert type(info.value) is cls, f"{name}: {entry['about']}: got {info.value!r}"
    assert str(info.value)  # the message names what was wrong


def test_fixtures_are_reproducible(tmp_path):
    GEN.write(tmp_path)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in HERE.iterdir() if p.suffix in (".bin", ".json"))
    for name in written:
        assert (tmp_path / name).read_bytes() == (HERE / name).read_bytes(), name


def test_every_decode_error_class_has_a_fixture_or_a_unit_test():
    covered = {e["error"] for e in MANIFEST.values()}
    unit_tested = {"NoHello", "MessageLimit", "FeatureLimit", "BadDtype", "BadShape"}
    decode_errors = {n for n in E.__all__ if isinstance(getattr(E, n), type)
                     and issubclass(getattr(E, n), E.DecodeError) and n != "DecodeError"}
    assert decode_errors - covered - unit_tested == set()
