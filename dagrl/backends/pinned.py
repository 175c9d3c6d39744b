"""Pinned host buffers carved out of a few slabs whose sizes are powers of two.

torch's pinned host allocator (CachingHostAllocator, behind `torch.empty(..., pin_memory=True)`)
rounds every block up to the next power of two, so a buffer per tensor took 1.33-1.41x its bytes
for Qwen3 0.6B-8B shapes (8B's fp32 state: 30.5 GiB locked 40.6) and one buffer just over a power
of two nearly twice (megatron's 9 GiB parameter buffer: 16). Here the items are packed into slabs
whose sizes are powers of two already, so the allocator's rounding adds nothing, and the memory
plan counts the same packing (`pinned_bytes`, a pure function: no allocation) as the code pins.

The packing (`pack`): every item starts 512-byte aligned (`ALIGN`: more than any dtype or vector
load needs, and DMA-friendly). While items are left, with R their aligned bytes, the next slab is
- `SLAB` (4 GiB) when R is at least that (larger when one item is: the slab must hold it);
- below that, R's leading binary digit, or the power of two the largest item left needs if that is
  more (then everything left fits in it);
- below `SMALLEST_SLAB` (1 MiB), the power of two that holds R: the last slab.
It is filled from the items left, largest first, each taken if it fits (first-fit decreasing, one
slab at a time); an item that may be split (`split=True`: a storage HostStore copies byte ranges
of) fills the slab to its end and goes on in the next one, in the order given.

Waste: split items fill every slab exactly but the last, which wastes less than 1 MiB. Whole items:
a slab that is not the last lacks less than the smallest item it could not take (the norms' few
KiB when such items are left), the last one less than max(1 MiB, its largest item); no slab is
filled less than half, so the total never exceeds twice the aligned bytes (one rounding's worst
case), and for a model's tensors it is within a few MiB of them (tests/backends/test_pinned.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ALIGN = 512  # bytes: where every item starts
SLAB = 1 << 32  # bytes: the largest slab, unless an item needs more
SMALLEST_SLAB = 1 << 20  # bytes: below this what is left goes into one last slab


@dataclass(frozen=True)
class Piece:
    """`nbytes` bytes of an item, from its byte `start`, at byte `offset` of slab `slab`."""

    slab: int
    offset: int
    start: int
    nbytes: int


@dataclass(frozen=True)
class Packing:
    slabs: tuple[int, ...]  # bytes of each slab, each a power of two
    places: tuple[tuple[Piece, ...], ...]  # for each item, in the order given: where its bytes go

    @property
    def pinned(self) -> int:
        return sum(self.slabs)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _ceil_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _slab_size(left: int, largest: int, cap: int) -> int:
    """The next slab's bytes for `left` aligned bytes of items, the largest `largest` (0: split)."""
    if left >= cap:
        return cap
    if left < SMALLEST_SLAB:
        return _ceil_pow2(left)
    return max(1 << (left.bit_length() - 1), _ceil_pow2(largest))


def pack(sizes: Sequence[int], split: bool = False, slab: int = SLAB) -> Packing:
    """Where items of `sizes` bytes go in pinned slabs (module docstring); `split`: an item may be
    cut at a slab's end (its pieces are then in its byte order); `slab`: the largest slab (a power
    of two, other than SLAB in tests). Empty items get no piece."""
    return _pack(tuple(int(n) for n in sizes), split, slab)


def pinned_bytes(sizes: Sequence[int], split: bool = False, slab: int = SLAB) -> int:
    """What `pack(sizes, split, slab)` pins, as torch's allocator takes it (each slab a power of
    two): what the memory plan counts."""
    return _pack(tuple(int(n) for n in sizes), split, slab).pinned


@functools.lru_cache(maxsize=64)
def _pack(sizes: tuple[int, ...], split: bool, slab: int) -> Packing:
    assert slab == _ceil_pow2(slab) >= SMALLEST_SLAB, slab
    left = {i: aligned(n) for i, n in enumerate(sizes) if n > 0}  # aligned bytes not yet placed
    order = list(left) if split else sorted(left, key=lambda i: (-left[i], i))
    cap = slab if split else max(slab, _ceil_pow2(max(left.values(), default=0)))
    slabs: list[int] = []
    places: list[list[Piece]] = [[] for _ in sizes]
    while order:
        size = _slab_size(sum(left[i] for i in order), 0 if split else left[order[0]], cap)
        offset = 0
        for i in order:
            take = min(left[i], size - offset) if split else left[i]
            if take == 0 or offset + take > size:
                continue
            start = aligned(sizes[i]) - left[i]
            places[i].append(Piece(len(slabs), offset, start, min(take, sizes[i] - start)))
            left[i] -= take
            offset += take
            if offset == size:
                break
        order = [i for i in order if left[i]]
        slabs.append(size)
    return Packing(tuple(slabs), tuple(tuple(p) for p in places))


def allocate(packing: Packing, pin: bool) -> list[torch.Tensor]:
    """The slabs of `packing` as uint8 host tensors, page-locked when `pin` (one pinned block each,
    its size a power of two: the allocator rounds nothing up)."""
    return [torch.empty(n, dtype=torch.uint8, pin_memory=pin) for n in packing.slabs]


def carve(
    like: Sequence[tuple[torch.Size, torch.dtype]], pin: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(slabs, a host tensor per (shape, dtype) of `like`, each a view into one slab): buffers for
    tensors that must stay whole (an optimizer's gradient, a copy's staging)."""
    sizes = [_numel(shape) * dtype.itemsize for shape, dtype in like]
    packing = pack(sizes)
    slabs = allocate(packing, pin)
    views = []
    for (shape, dtype), n, places in zip(like, sizes, packing.places):
        if not places:  # an empty tensor
            views.append(torch.empty(shape, dtype=dtype, pin_memory=pin))
            continue
        (piece,) = places
        views.append(slabs[piece.slab][piece.offset : piece.offset + n].view(dtype).view(shape))
    return slabs, views


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
