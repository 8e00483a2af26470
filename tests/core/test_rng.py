"""Noise streams: Philox known answers, purity, stream disjointness, range."""

import numpy as np
import pytest
import torch

from specpair.rng import Stream, philox4x32, uniform


def _words(*vals):
    return tuple(np.array([v], dtype=np.uint64) for v in vals)


@pytest.mark.parametrize(
    ("ctr", "key", "expected"),
    [
        # Random123 kat_vectors, philox4x32_10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_known_answers(ctr, key, expected):
    out = philox4x32(_words(*ctr), _words(*key))
    assert tuple(int(w[0]) for w in out) == expected


def test_uniform_is_a_pure_function_of_its_key():
    seeds = torch.tensor([3, -7, 2**62 + 5, 0])
    pos = torch.tensor([0, 17, 2**32 - 1, 99])
    u = uniform(seeds, pos, Stream.ACCEPT)
    # element by element, in another order, in another batch: the same values
    for i in reversed(range(4)):
        assert uniform(seeds[i], pos[i], Stream.ACCEPT).item() == u[i].item()
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.equal(uniform(seeds[perm], pos[perm], Stream.ACCEPT), u[perm])


def test_streams_indices_positions_and_seeds_give_distinct_draws():
    seed = torch.arange(64).repeat_interleave(64)
    pos = torch.arange(64).repeat(64)
    draws = [uniform(seed, pos, s) for s in Stream] + [uniform(seed, pos, Stream.DRAFT, 1)]
    allv = torch.cat(draws)
    # 5 * 4096 draws with 52 random bits: any repeat means aliasing, not chance
    assert allv.unique().numel() == allv.numel()


def test_uniform_range_and_moments():
    u = uniform(torch.tensor(11), torch.arange(200_000), Stream.BONUS)
    assert u.dtype == torch.float64
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002


def test_fields_must_fit_their_32_bit_words():
    with pytest.raises(ValueError, match="position"):
        uniform(torch.tensor(0), torch.tensor(2**32), Stream.DRAFT)
    with pytest.raises(ValueError, match="index"):
        uniform(torch.tensor(0), torch.tensor(0), Stream.DRAFT, -1)
