"""HostStore on CPU tensors (cpu_too): storages freed and restored bit for bit, tensors keep their
identity, shared storages move once, buffers are reused from one offload to the next."""

from __future__ import annotations

import torch

from dagrl.backends.host_store import HostStore


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
        buffers = [id(x) for x in store._buffers]
        assert len(buffers) == 2  # one per storage, not per tensor
        store.onload()
        assert not store.holds
        assert all(torch.equal(t, e) for t, e in zip((a, b, c), expected))
    assert [id(x) for x in store._buffers] == buffers  # the second cycle reused the first's buffers


def test_cpu_tensors_stay_unless_asked():
    t = torch.randn(5)
    store = HostStore()
    store.offload([t])
    assert not store.holds and t.untyped_storage().nbytes() == 20
