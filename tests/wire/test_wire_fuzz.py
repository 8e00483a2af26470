"""Mutation fuzz in `make test`: 100k mutated valid frames, zero non-wire exceptions, no hang.

The longer, freshly seeded run is `make fuzz` (tests/wire/wire_fuzz.py).
"""

from __future__ import annotations

import os

import wire_fuzz


def test_mutation_fuzz_100k():
    n = int(os.environ.get("SPECPAIR_WIRE_FUZZ", "100000"))
    out = wire_fuzz.run(n, seed=20261129, watchdog_s=300.0)  # the watchdog ends a hang
    assert out.failures == [], out.failures[:5]
    assert out.iterations == n
    # the mutants reach deep checks, not only the header and the CRC
    deep = {"TokenOutOfRange", "UnnormalizedQ", "NonFiniteQ", "SupportPadding", "BadParams",
            "FeatureMismatch", "DepthLimit", "NonZeroPadding"}
    assert deep <= set(out.refused), sorted(out.refused)
    assert out.decoded > 0
