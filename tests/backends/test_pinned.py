"""Pinned slabs (backends/pinned.py): every slab a power of two, every item aligned, whole or in
pieces that do not overlap, each inside its slab, the waste within the module docstring's bound,
and the figure the plan counts (pinned_bytes) the bytes the allocator is asked for."""

from __future__ import annotations

import random

import pytest
import torch

from dagrl.backends.model_shape import ModelShape, tensor_numels
from dagrl.backends.pinned import ALIGN, SLAB, SMALLEST_SLAB, aligned, carve, pack, pinned_bytes

MIB = 1 << 20


def qwen3_shape(hidden, layers, heads, kv_heads, intermediate, tied, vocab=151_936, head_dim=128):
    """A Qwen3 ModelShape whose parameter count is its tensors' (tests/backends/test_model_shape.py
    checks tensor_numels against the HF model's own list)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    layer = 2 * hidden * q + 2 * hidden * kv + 2 * head_dim + 3 * hidden * intermediate + 2 * hidden
    params = vocab * hidden * (1 if tied else 2) + hidden + layers * layer
    return ModelShape(
        hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied, params, qk_norm=True
    )


SHAPES = {  # bench/real_size_gpu.py's
    "0.6b": qwen3_shape(1024, 28, 16, 8, 3072, True),
    "1.7b": qwen3_shape(2048, 28, 16, 8, 6144, True),
    "4b": qwen3_shape(2560, 36, 32, 8, 9728, True),
    "8b": qwen3_shape(4096, 36, 32, 8, 12288, False),
}


def check_packing(sizes, split, slab=SLAB):
    """The invariants of pack(sizes, split, slab), with the per-slab waste bound; returns it."""
    packing = pack(sizes, split, slab)
    assert all(n > 0 and n & (n - 1) == 0 for n in packing.slabs)
    assert packing.pinned == sum(packing.slabs) == pinned_bytes(sizes, split, slab)
    used: list[list[tuple[int, int]]] = [[] for _ in packing.slabs]  # aligned extents per slab
    slab_items: list[list[int]] = [[] for _ in packing.slabs]
    for i, (n, places) in enumerate(zip(sizes, packing.places)):
        assert sum(p.nbytes for p in places) == n  # every byte, once
        assert [p.start for p in places] == sorted(p.start for p in places)
        assert places[0].start == 0 if n else places == ()
        if not split:
            assert len(places) <= 1  # whole
        for p in places:
            assert p.offset % ALIGN == 0 and p.start % ALIGN == 0
            extent = min(aligned(n) - p.start, packing.slabs[p.slab] - p.offset)
            assert p.nbytes <= extent and p.offset + extent <= packing.slabs[p.slab]
            used[p.slab].append((p.offset, p.offset + extent))
            slab_items[p.slab].append(i)
    for extents in used:  # no overlap
        extents.sort()
        assert all(a[1] <= b[0] for a, b in zip(extents, extents[1:]))
    free = [size - sum(b - a for a, b in e) for size, e in zip(packing.slabs, used)]
    for k, items in enumerate(slab_items):
        largest = max(aligned(sizes[i]) for i in items)
        later = [aligned(sizes[i]) for j in range(k + 1, len(slab_items)) for i in slab_items[j]]
        if split:
            assert free[k] == 0 if k < len(free) - 1 else free[k] < SMALLEST_SLAB
        elif later:  # less than the smallest item it could not take
            assert free[k] < min(later)
        else:
            assert free[k] < max(SMALLEST_SLAB, largest)
        assert packing.slabs[k] < 2 * (packing.slabs[k] - free[k]) or free[k] == 0  # over half full
    return packing


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_random_items_pack_within_the_bound(split):
    rng = random.Random(0)
    for _ in range(30):
        big = rng.choice([4 * MIB, 64 * MIB, 3 * SLAB // 2])
        sizes = [
            rng.choice([rng.randrange(1, 4096), rng.randrange(1, big)]) for _ in range(rng.randrange(1, 60))
        ]
        check_packing(sizes, split, slab=16 * MIB if big < SLAB else SLAB)


def test_an_item_larger_than_a_slab_gets_a_slab_it_fits_in_and_shares_it():
    sizes = [5 << 30, 2 << 30, 1 << 30, 4096]
    packing = check_packing(sizes, split=False)
    assert packing.slabs == (8 << 30, 4096)  # 5 + 2 + 1 GiB, then what is left
    split = check_packing(sizes, split=True)
    assert split.slabs[:2] == (SLAB, SLAB) and split.pinned - sum(map(aligned, sizes)) < SMALLEST_SLAB


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_models_tensors_cost_their_bytes_not_the_allocators_rounding(name):
    """Per tensor, torch's pinned allocator took 1.33-1.41x the fp32 state of these shapes; one
    buffer per kind (the host step's before) up to twice. Packed: within 0.2 % (whole tensors:
    the host step's gradient and staging buffers) and 1 MiB (split: an offload's storages)."""
    numels = tensor_numels(SHAPES[name])
    state = [4 * n for n in numels] * 3 + [2 * n for n in numels]  # fp32 master, m, v; bf16 weights
    per_tensor = sum(1 << (n - 1).bit_length() for n in state)
    assert 1.33 < per_tensor / sum(state) < 1.41
    assert check_packing(state, split=True).pinned - sum(map(aligned, state)) < SMALLEST_SLAB
    buffers = [4 * n for n in numels] + [2 * n for n in numels]
    assert check_packing(buffers, split=False).pinned < 1.002 * sum(map(aligned, buffers))


def test_carved_views_are_the_tensors_asked_for_inside_their_slabs():
    """Real tensors (a small model's gradient and bf16 staging buffers, as MasterWeightsAdamW asks):
    shapes and dtypes, 512-byte aligned within their slab, inside it, no two overlapping, and
    the slabs' bytes those pinned_bytes counts."""
    torch.manual_seed(0)
    shapes = [torch.Size(s) for s in [(1000, 64), (64,), (3, 5), (128, 64), (64, 128), (7,), (0,)]]
    like = [(s, torch.float32) for s in shapes] + [(s, torch.bfloat16) for s in shapes]
    slabs, views = carve(like, pin=False)
    sizes = [s.numel() * d.itemsize for s, d in like]
    assert sum(s.numel() for s in slabs) == pinned_bytes(sizes)
    spans = []
    for (shape, dtype), view in zip(like, views):
        assert view.shape == shape and view.dtype == dtype and view.is_contiguous()
        if not view.numel():
            continue
        [slab] = [s for s in slabs if s.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()]
        offset = view.data_ptr() - slab.data_ptr()
        assert offset % ALIGN == 0 and offset + view.nbytes <= slab.numel()
        spans.append((view.data_ptr(), view.data_ptr() + view.nbytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    for view in views:  # writable and independent
        view.copy_(torch.randn(view.shape))
    expected = [v.clone() for v in views]
    for view in views[::2]:
        view.zero_()
    assert all(torch.equal(v, e) for v, e in zip(views[1::2], expected[1::2]))
