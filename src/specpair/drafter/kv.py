"""The drafter's KV cache: per layer, keys and values in buffers with room, written in place.

transformers' ``DynamicCache`` concatenates every forward's keys and values onto the whole
cache, a copy of everything held per layer per draft step, and the drafter's batched rounds
added two more per round (stacking the rows' caches, splitting them back). Here a forward
writes its new slots into spare room and attends over a view of the filled ones, cropping
only moves the end, and a batched round copies each row's past once (``stack``) and hands
each row back only the slots the round added (``merge``). The values and the shapes the
attention sees are the same, so are the logits' bits (tests/drafter/test_drafter_bits.py,
tests/drafter/test_llama_forward.py). A buffer that must grow is made an eighth larger than
the write needs, at least ``ROOM`` slots, so a request holds at most that much beyond its
tokens and the copies of growing cost O(1) a token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["KV", "capacity"]

ROOM = 8  # free slots at least, after a buffer grows


def capacity(slots: int) -> int:
    """The slots a buffer that must hold ``slots`` is made with."""
    return slots + max(ROOM, slots // 8)


class KV:
    """Keys and values of B rows, per layer ``[B, heads, capacity, head_dim]``, the first
    ``length(i)`` slots of layer i filled; the buffers are made on the first write."""

    def __init__(self, bufs: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                 length: int = 0) -> None:
        self.bufs = bufs or []
        self.lens = [length] * len(self.bufs)

    def get_seq_length(self, layer: int = 0) -> int:
        return self.lens[layer] if layer < len(self.lens) else 0

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor,
                                                                             torch.Tensor]:
        """Write ``k``, ``v`` [B, heads, t, head_dim] after layer ``layer``'s filled slots;
        views of every filled slot (``DynamicCache.update``'s contract)."""
        if layer == len(self.bufs):
            self.bufs.append((k.new_zeros(_shape(k, capacity(k.shape[2]))),
                              v.new_zeros(_shape(v, capacity(v.shape[2])))))
            self.lens.append(0)
        n, t = self.lens[layer], k.shape[2]
        keys, values = self.bufs[layer]
        if n + t > keys.shape[2]:
            keys, values = (_grown(x, n, capacity(n + t)) for x in (keys, values))
            self.bufs[layer] = (keys, values)
        keys[:, :, n: n + t] = k
        values[:, :, n: n + t] = v
        self.lens[layer] = n + t
        return self.view(layer)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots (no copy: later writes overwrite the rest)."""
        self.lens = [min(n, length) for n in self.lens]

    def nbytes(self) -> int:
        """Bytes the buffers hold (filled or not)."""
        return sum(x.numel() * x.element_size() for kv in self.bufs for x in kv)

    def view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s filled keys and values (views)."""
        n = self.lens[layer]
        return self.bufs[layer][0][:, :, :n], self.bufs[layer][1][:, :, :n]

    @classmethod
    def stack(cls, caches: Sequence[KV | None], past: Sequence[int], fed: int) -> KV:
        """One batch of the rows' caches, row b's ``past[b]`` slots right-aligned at
        ``max(past)`` after zeros, with room for ``fed`` more slots and then some."""
        p_max = max(past)
        template = next((c for c in caches if c is not None and c.bufs), None)
        if p_max == 0 or template is None:
            return cls()
        bufs = []
        for li, (ref, _) in enumerate(template.bufs):
            shape = (len(caches), ref.shape[1], capacity(p_max + fed), ref.shape[3])
            keys, values = ref.new_zeros(shape), ref.new_zeros(shape)
            for b, (c, p) in enumerate(zip(caches, past, strict=True)):
                if c is not None and p:
                    k, v = c.view(li)
                    keys[b, :, p_max - p: p_max] = k[0]
                    values[b, :, p_max - p: p_max] = v[0]
            bufs.append((keys, values))
        return cls(bufs, p_max)

    def merge(self, row: int, slots: torch.Tensor, into: KV | None) -> KV:
        """Append this batch's ``slots`` (int64 indices) of row ``row`` to ``into`` (a new
        cache when None); returns it."""
        out = KV() if into is None else into
        for li, (keys, values) in enumerate(self.bufs):
            out.update(keys[row: row + 1, :, slots], values[row: row + 1, :, slots], li)
        return out


def _shape(x: torch.Tensor, slots: int) -> tuple[int, int, int, int]:
    return (x.shape[0], x.shape[1], slots, x.shape[3])


def _grown(x: torch.Tensor, filled: int, slots: int) -> torch.Tensor:
    out = x.new_zeros(_shape(x, slots))
    out[:, :, :filled] = x[:, :, :filled]
    return out
