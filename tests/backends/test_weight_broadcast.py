"""The trainer → rollout broadcast: bucket packing, and a real gloo group of one sender and two
receivers on threads of one process (the NCCL form runs in the GPU suite)."""

from __future__ import annotations

import torch

from dagrl.backends.weight_broadcast import BroadcastGroup, pack, pack_layout, unpack
from tests.gloo_threads import free_port, on_threads


def bucket_of_every_kind() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(3, 5, generator=g).to(torch.bfloat16),  # 30 bytes: next offset aligns up
        "b.bias": torch.randn(7, generator=g),
        "c.scale": torch.tensor(2.5),  # 0-dim
        "d.ids": torch.arange(4),
        "e.empty": torch.zeros(0, 3),
    }


def test_pack_unpack_roundtrip_keeps_names_dtypes_shapes_values():
    bucket = bucket_of_every_kind()
    layout, total = pack_layout(bucket)
    assert all(offset % 16 == 0 for _, _, _, offset, _ in layout)
    out = unpack(pack(bucket, layout, total, torch.device("cpu")), layout)
    assert list(out) == list(bucket)
    for name, tensor in bucket.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor)


def test_one_sender_two_receivers_over_gloo():
    # members on threads of this process: gloo runs the broadcasts on its own threads, and
    # separate processes cost ~15 s of imports on CI while checking nothing more
    port = free_port()
    out = {}

    def member(rank: int) -> None:
        group = BroadcastGroup("127.0.0.1", port, rank, 3, torch.device("cpu"))
        buckets = [bucket_of_every_kind(), {"f.weight": torch.full((64, 64), float(rank == 0))}]
        if rank == 0:
            out[rank] = (group.send(iter(buckets)), None)
            return
        got = {}

        def load(bucket):
            got.update({k: v.clone() for k, v in bucket.items()})  # views of a buffer reused per bucket
            return sum(v.numel() * v.element_size() for v in bucket.values())

        out[rank] = (group.receive(load), got)

    on_threads(3, member)
    sent = out[0][0]
    expected = {**bucket_of_every_kind(), "f.weight": torch.ones(64, 64)}  # rank 0's values
    for rank in (1, 2):
        nbytes, got = out[rank]
        payload = sum(v.numel() * v.element_size() for v in expected.values())
        assert sent >= nbytes == payload > 64 * 64 * 4  # sent: packed, aligned to 16 bytes
        assert list(got) == list(expected)
        assert all(torch.equal(got[k], v) for k, v in expected.items())
