"""The trainer → rollout broadcast: bucket packing, and a real gloo group of one sender and two
receivers in separate processes (the NCCL form runs in the GPU suite)."""

from __future__ import annotations

import io
import multiprocessing as mp
import socket

import torch

from dagrl.backends.weight_broadcast import BroadcastGroup, pack, pack_layout, unpack


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


def _member(rank: int, world: int, port: int, results) -> None:
    group = BroadcastGroup("127.0.0.1", port, rank, world, torch.device("cpu"))
    buckets = [bucket_of_every_kind(), {"f.weight": torch.full((64, 64), float(rank == 0))}]
    if rank == 0:
        results.put((rank, group.send(iter(buckets)), None))
        return
    got = {}

    def load(bucket):
        got.update({k: v.clone() for k, v in bucket.items()})  # views of a buffer reused per bucket
        return sum(v.numel() * v.element_size() for v in bucket.values())

    nbytes = group.receive(load)
    # as bytes: a tensor put on a queue is shared through this process's file descriptors, which
    # are gone if it exits before the parent reads it (FileNotFoundError in the parent's get)
    buffer = io.BytesIO()
    torch.save(got, buffer)
    results.put((rank, nbytes, buffer.getvalue()))


def test_one_sender_two_receivers_over_gloo():
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(r, 3, port, results)) for r in range(3)]
    for p in procs:
        p.start()
    out = {rank: (nbytes, got) for rank, nbytes, got in (results.get(timeout=120) for _ in procs)}
    out = {rank: (nbytes, got and torch.load(io.BytesIO(got))) for rank, (nbytes, got) in out.items()}
    for p in procs:
        p.join(timeout=30)
    sent = out[0][0]
    expected = {**bucket_of_every_kind(), "f.weight": torch.ones(64, 64)}  # rank 0's values
    for rank in (1, 2):
        nbytes, got = out[rank]
        payload = sum(v.numel() * v.element_size() for v in expected.values())
        assert sent >= nbytes == payload > 64 * 64 * 4  # sent: packed, aligned to 16 bytes
        assert list(got) == list(expected)
        assert all(torch.equal(got[k], v) for k, v in expected.items())
