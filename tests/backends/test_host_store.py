"""HostStore on CPU tensors (cpu_too): storages freed and restored bit for bit, tensors keep their
identity, shared storages move once, the same slabs are reused from one offload to the next, and
the slabs are the packing the memory plan counts (pinned.pinned_bytes over the storages, split)."""

from __future__ import annotations

import torch

from dagrl.backends.host_store import HostStore
from dagrl.backends.pinned import SMALLEST_SLAB, pinned_bytes


def test_offload_frees_restores_and_reuses_buffers():
    torch.manual_seed(0)
    flat = torch.randn(10)
    a, b = flat[:4], flat[4:]  # two views of one storage (a flat buffer, as megatron's)
    c = torch.randn(3, 3)
    expected = [t.clone() for t in (a, b, c)]
    store = HostStore()
    for _ in range(2):
        store.offload([a, b, c], cpu_too=True)
        assert store.holds
        assert a.untyped_storage().nbytes() == 0 and c.untyped_storage().nbytes() == 0
        store.offload([a, b, c], cpu_too=True)  # again while offloaded: nothing left to move
        slabs = [id(x) for x in store._slabs]
        assert store.pinned_bytes == pinned_bytes([40, 36], split=True) == 1024  # one slab, two items
        store.onload()
        assert not store.holds
        assert all(torch.equal(t, e) for t, e in zip((a, b, c), expected))
    assert [id(x) for x in store._slabs] == slabs  # the second cycle reused the first's slabs


def test_storages_cut_at_slab_ends_come_back_bit_exact_in_the_planned_slabs():
    """Storages whose bytes fill a 2 MiB slab and spill into smaller ones (a storage split across
    two), in several dtypes: the slabs are the plan's figure, a power of two each, exactly filled
    but the last; a storage of another size re-packs them."""
    torch.manual_seed(0)
    tensors = [
        torch.randn(180_000),  # 720,000 B
        torch.randn(300, 1000).to(torch.bfloat16),  # 600,000 B
        torch.randint(-(2**31), 2**31 - 1, (200_001,), dtype=torch.int32),  # 800,004 B
        torch.randn(4097, dtype=torch.float64),
    ]
    expected = [t.clone() for t in tensors]
    sizes = [t.untyped_storage().nbytes() for t in tensors]
    store = HostStore()
    store.offload(tensors, cpu_too=True)
    assert store.pinned_bytes == pinned_bytes(sizes, split=True) < sum(sizes) + SMALLEST_SLAB
    assert [s.numel() for s in store._slabs] == [2 << 20, 64 << 10]  # 2.05 MiB of items
    pieces = [len(places) for *_, places in store._moved]
    assert pieces == [1, 1, 2, 1]  # the third storage goes on in the second slab
    store.onload()
    assert all(torch.equal(t, e) for t, e in zip(tensors, expected))
    slabs = store._slabs
    grown = [*tensors, torch.randn(10)]
    store.offload(grown, cpu_too=True)
    assert store._slabs is not slabs and store.pinned_bytes == pinned_bytes([*sizes, 40], split=True)
    store.onload()
    assert all(torch.equal(t, e) for t, e in zip(grown, [*expected, grown[-1]]))


def test_cpu_tensors_stay_unless_asked():
    t = torch.randn(5)
    store = HostStore()
    store.offload([t])
    assert not store.holds and t.untyped_storage().nbytes() == 20
