"""specpair.drafter.kv: in-place writes, crops, growth, and a batch's stack and merge give the
values DynamicCache's concatenation would."""

from __future__ import annotations

import torch

from specpair.drafter.kv import KV, capacity


def _kv(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, t, 4, generator=g), torch.randn(1, 2, t, 4, generator=g)


def test_writes_crops_and_growth_keep_the_concatenated_values():
    cache, keys, values = KV(), [], []
    for i, t in enumerate([5, 1, 1, 30, 1, 2]):
        k, v = _kv(t, i)
        got_k, got_v = cache.update(k, v, 0)
        keys.append(k)
        values.append(v)
        assert torch.equal(got_k, torch.cat(keys, dim=2))
        assert torch.equal(got_v, torch.cat(values, dim=2))
    n = cache.get_seq_length()
    assert n == 40 and cache.bufs[0][0].shape[2] <= capacity(n)
    cache.crop(6)  # drop the last 34 slots; the next write overwrites them
    k, v = _kv(3, 99)
    got_k, _ = cache.update(k, v, 0)
    assert torch.equal(got_k, torch.cat([keys[0], keys[1], k], dim=2))


def test_stack_then_merge_hands_each_row_its_own_slots():
    rows = []
    for past in (3, 0, 7):
        if past:
            c = KV()
            c.update(*_kv(past, past), 0)
            rows.append(c)
        else:
            rows.append(None)
    before = [c.view(0)[0].clone() if c else None for c in rows]
    batch = KV.stack(rows, [3, 0, 7], fed=2)
    assert batch.get_seq_length() == 7
    assert torch.equal(batch.view(0)[0][0, :, 4:], before[0][0])  # right-aligned at 7
    assert not batch.view(0)[0][1].any()  # a new row: zeros
    new_k, new_v = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4)
    batch.update(new_k, new_v, 0)
    slots = torch.tensor([7, 8])
    merged = [batch.merge(b, slots, c) for b, c in enumerate(rows)]
    assert merged[0] is rows[0] and merged[2] is rows[2]  # appended to the row's own cache
    assert torch.equal(merged[0].view(0)[0], torch.cat([before[0], new_k[0:1]], dim=2))
    assert torch.equal(merged[1].view(0)[1], new_v[1:2])
    assert [m.get_seq_length() for m in merged] == [5, 2, 9]
