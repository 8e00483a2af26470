"""Gate: the probability wire's self-test (wire_selftest.py beside it), run inside images.

Every frame kind round-trips; the decoder refuses a truncated frame, bad magic,
a wrong version, a bad checksum, an unknown kind, an oversized frame, an id >= V,
NaN q, un-normalized q, q(d) = 0 and a duplicate request, each with its own error
class; one authenticated loopback round on 127.0.0.1 is served; a client without
the key is refused. Deterministic: no statistical threshold, no false failures.
Must-fail control: test_selftest_catches_a_decoder_that_accepts_nan shows a
decoder that forgets one check (the compiled SPARSE check passing NaN log q) fails
the self-test.
"""

from __future__ import annotations

import pytest
import wire_selftest

from specpair.wire.codec import _sparse

pytestmark = pytest.mark.gate


def test_wire_selftest():
    checks = wire_selftest.run()
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    assert not failed, "\n".join(failed)
    assert len(checks) >= 20


def test_selftest_catches_a_decoder_that_accepts_nan(monkeypatch):
    check = _sparse.decode_run

    def forgets_nan(*args):
        bad = check(*args)
        return None if bad is not None and bad[1] == _sparse.NON_FINITE else bad

    monkeypatch.setattr(_sparse, "decode_run", forgets_nan)
    failed = {c.name for c in wire_selftest.run() if not c.ok}
    assert "refuse NaN q" in failed
