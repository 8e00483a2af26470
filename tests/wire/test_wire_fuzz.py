"""Mutation fuzz in `make test`: 2 x 100k mutated valid frames, zero non-wire exceptions, no hang.

One run repairs the CRC of most mutants (the rest test the header and the checksum), one
of every mutant (so that all of them reach the body's checks). The longer,
freshly seeded run is `make fuzz` (tests/wire/wire_fuzz.py).
"""

from __future__ import annotations

import os

import wire_fuzz

N = int(os.environ.get("SPECPAIR_WIRE_FUZZ", "100000"))
# the mutants reach deep checks, not only the header and the CRC
DEEP = {"TokenOutOfRange", "UnnormalizedQ", "NonFiniteQ", "SupportPadding", "BadParams",
        "FeatureMismatch", "DepthLimit", "NonZeroPadding"}


def test_mutation_fuzz_100k():
    out = wire_fuzz.run(N, seed=20261129, watchdog_s=300.0)  # the watchdog ends a hang
    assert out.failures == [], out.failures[:5]
    assert out.iterations == N
    assert DEEP | {"BadChecksum"} <= set(out.refused), sorted(out.refused)
    assert out.decoded > 0


def test_mutation_fuzz_100k_crc_recomputed_after_every_mutation():
    out = wire_fuzz.run(N, seed=20261130, watchdog_s=300.0, reseal="always")
    assert out.failures == [], out.failures[:5]
    assert out.iterations == N
    assert "BadChecksum" not in out.refused  # every mutant carried its CRC
    assert DEEP | {"ZeroDraftQ", "DuplicateSupportId"} <= set(out.refused), sorted(out.refused)
    assert out.decoded > 0
