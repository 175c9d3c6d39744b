"""Weight sync: the one service that moves the actor's weights into another role.

Called by the `weight_sync` DAG node (and by nothing hidden). Two paths, chosen by placement:
- colocated (one pool): on each worker, the source backend exports HF-named buckets and the
  destination backend loads them, in process (tensors stay on the device);
- separate pools: every source worker exports (a sharded backend gathers its shards
  collectively), source rank 0 puts its buckets into the Ray object store, and every destination
  worker pulls them one bucket at a time (host memory holds one bucket per worker).
Bytes and seconds are returned as metrics every time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import ray
import torch

if TYPE_CHECKING:
    from dagrl.core.pools import RoleHandle


def weight_buckets(
    named: Iterable[tuple[str, torch.Tensor]], limit_bytes: int, to_cpu: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """(name, tensor) pairs grouped into dicts of about limit_bytes (one tensor may exceed it)."""
    bucket, size = {}, 0
    for name, tensor in named:
        t = tensor.detach().cpu() if to_cpu else tensor.detach()
        if bucket and size + t.numel() * t.element_size() > limit_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = t
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket


def sync_weights(src: RoleHandle, dst: RoleHandle) -> dict[str, float]:
    """Copy src's current weights into dst; returns weight_sync/{bytes,s,GBps}."""
    start = time.perf_counter()
    if src.pool is dst.pool:
        with dst.pool.lock:
            nbytes = ray.get([a.run.remote(_copy_local, src.role, dst.role) for a in dst.pool.actors])
    else:
        with src.pool.lock, dst.pool.lock:
            exports = [a.run.remote(_export_refs, src.role, i == 0) for i, a in enumerate(src.pool.actors)]
            refs = ray.get(exports)[0]
            nbytes = ray.get([a.run.remote(_load_refs, dst.role, refs) for a in dst.pool.actors])
    seconds = time.perf_counter() - start
    return {
        "weight_sync/bytes": float(nbytes[0]),
        "weight_sync/s": seconds,
        "weight_sync/GBps": nbytes[0] / max(seconds, 1e-9) / 1e9,
    }


# ---- run inside a worker (Worker.run) ------------------------------------------------------------
def _copy_local(worker, src: str, dst: str) -> int:
    buckets = list(worker.activate(src).export_weights())
    return worker.activate(dst).load_weights(buckets)


def _export_refs(worker, src: str, keep: bool) -> list:
    """Every worker of the source pool takes part; only the one with keep=True stores buckets."""
    refs = []
    for bucket in worker.activate(src).export_weights(to_cpu=keep):
        if keep:
            refs.append(ray.put(bucket))
    return refs


def _load_refs(worker, dst: str, refs: list) -> int:
    backend, nbytes = worker.activate(dst), 0
    for ref in refs:  # one bucket in memory at a time
        nbytes += backend.load_weights([ray.get(ref)])
    return nbytes
