"""Weight sync: the one service that moves the actor's weights into another role.

Called by the `weight_sync` DAG node (and by nothing hidden). Two paths, chosen by placement:
- colocated (one pool): on each worker, the source backend exports HF-named buckets and the
  destination loads them in process (tensors stay on the device), in stages so the GPU never
  holds the destination's old weights, the new ones and its KV cache at once: it wakes its weights
  only, loads, the source leaves the device, then the destination takes the rest;
- separate pools: every source worker exports (a sharded backend gathers its shards
  collectively) and source rank 0 broadcasts each bucket to every destination worker over a
  process group of their own (weight_broadcast.py: NCCL on GPUs, gloo on CPU), set up at the
  first sync, when its plain broadcast speed is measured (`weight_sync/broadcast_floor_GBps`).
  That first sync also learns where each HF tensor lands in the engine's parameters
  (weight_layout.py); from then on the buckets travel in the engine's own layout and are copied
  straight into its parameters (`rollout.weight_sync_direct`), or, when the map cannot be
  learnt (the reason is printed once), as HF-named buckets through the engine's loader.
Bytes and seconds are returned as metrics every time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from dagrl.backends.weight_layout import RecipeBuilder, Slot, plan_buckets

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
    """Copy src's current weights into dst; returns weight_sync/{bytes,s,GBps}, and when the pools
    are separate the broadcast floor and where the time went, in ms (weight_sync/<phase>_ms): the
    sender's export draw, packs (GPU time), host loop and whole call (send_ms); the receiver's
    wire, unpacks (GPU time), host loop, the engine's activate/begin/finish and whole call
    (receive_ms); what the driver adds beyond the slower worker (driver_ms). The HF-named path
    reports the whole calls and the engine only. CUDA events, read once per sync: kept every step.
    Colocated, the hand-over's stages (`_copy_local`: settle, wake_weights, load, release, wake_kv)."""
    start = time.perf_counter()
    metrics: dict[str, float] = {}
    if src.pool is dst.pool:
        with dst.pool.lock:
            copied = dst.pool.get([a.run.remote(_copy_local, src.role, dst.role) for a in dst.pool.actors])
        nbytes = [n for n, _ in copied]
        metrics |= {f"weight_sync/{k}": v for k, v in copied[0][1].items()}
    else:
        with src.pool.lock, dst.pool.lock:
            first = dst.pool.broadcast_floor_gbps is None
            if first:
                dst.pool.broadcast_floor_gbps = _join_broadcast_group(src, dst)
                start = time.perf_counter()  # the set-up is not part of a step's sync
            direct = dst.pool.weight_direct
            learn = first and _direct_enabled(src)
            sends = [a.run.remote(_send, src.role, direct) for a in src.pool.actors]
            receives = [a.run.remote(_receive, dst.role, direct, learn) for a in dst.pool.actors]
            done = dst.pool.get(receives + sends)
            received, sent = done[: len(receives)], done[len(receives) :]
            if learn:
                _adopt_layout(src, dst, [r[3] for r in received])
        nbytes = [r[0] for r in received]
        wire_bytes, wire_s = received[0][1:3]
        # direct: the receiver's whole refresh (broadcasts and copies into the engine); otherwise
        # the payload broadcasts alone. Against the group's plain broadcast speed either way.
        metrics["weight_sync/direct"] = float(direct)
        metrics["weight_sync/broadcast_GBps"] = wire_bytes / max(wire_s, 1e-9) / 1e9
        metrics["weight_sync/broadcast_floor_GBps"] = dst.pool.broadcast_floor_gbps
        metrics["weight_sync/broadcast_vs_floor"] = metrics["weight_sync/broadcast_GBps"] / max(
            dst.pool.broadcast_floor_gbps, 1e-9
        )
        sender = next((phases for n, phases in sent if n), sent[0][1])  # the one in the group
        metrics |= {f"weight_sync/{k}": v for k, v in (sender | received[0][4]).items()}
    seconds = time.perf_counter() - start
    metrics.update(
        {
            "weight_sync/bytes": float(nbytes[0]),
            "weight_sync/s": seconds,
            "weight_sync/GBps": nbytes[0] / max(seconds, 1e-9) / 1e9,
        }
    )
    if "weight_sync/receive_ms" in metrics:  # what the driver adds: Ray calls, the slower side
        worker_ms = max(metrics["weight_sync/receive_ms"], metrics["weight_sync/send_ms"])
        metrics["weight_sync/driver_ms"] = seconds * 1e3 - worker_ms
    return metrics


def _direct_enabled(src: RoleHandle) -> bool:
    return bool(src.pool.cfg.actor_rollout_ref.rollout.weight_sync_direct)


def _adopt_layout(src: RoleHandle, dst: RoleHandle, learnt: list) -> None:
    """Every receiver learnt the same slots: the sender gets the plan, later syncs go direct."""
    reasons = [x for x in learnt if isinstance(x, str)]
    if not reasons and any(x != learnt[0] for x in learnt):
        reasons = ["the rollout workers' engines are laid out differently"]
    if reasons:
        print(f"weight sync: HF-named buckets through the engine's loader ({reasons[0]})", flush=True)
        return
    src.pool.get([a.run.remote(_plan_sends, learnt[0]) for a in src.pool.actors])
    dst.pool.weight_direct = True


def _join_broadcast_group(src: RoleHandle, dst: RoleHandle) -> float:
    """Source rank 0 (group rank 0) and every destination worker form the broadcast group."""
    head = src.pool.actors[0]
    host = src.pool.get(head.node_info.remote())["ip"]
    port = src.pool.get(head.free_port.remote())
    world = 1 + len(dst.pool.actors)
    joins = [head.run.remote(_join, host, port, 0, world)]
    joins += [a.run.remote(_join, host, port, 1 + i, world) for i, a in enumerate(dst.pool.actors)]
    return float(dst.pool.get(joins)[0])


# ---- run inside a worker (Worker.run) ------------------------------------------------------------
def _copy_local(worker, src: str, dst: str) -> tuple[int, dict[str, float]]:
    """The colocated refresh, a hand-over with the copy inside it. Returns the bytes loaded and
    where the time went (ms, each stage's device work finished inside it): settling the device,
    the engine's weights waking, the load, the source's state leaving, the KV cache waking."""
    clock = _StageClock(worker.device)
    source = worker.activate(src)
    target = worker.backends[dst]
    worker.settle()  # the update's cached blocks go back before the engine maps its weights
    clock.stage("settle_ms")
    target.begin_weight_update()  # a sleeping engine wakes its weights, not its KV cache
    clock.stage("wake_weights_ms")
    nbytes = target.load_weights(source.export_weights())
    clock.stage("load_ms")
    worker.release_others(dst)  # the source leaves the device ...
    clock.stage("release_ms")
    target.finish_weight_update()  # ... before the destination takes the rest
    clock.stage("wake_kv_ms")
    worker.active = dst
    return nbytes, clock.stages


class _StageClock:
    """Host milliseconds per stage, the device's queued work finished at each stage's end (a
    handful of synchronizations per sync: the stages' copies are not charged to the next one)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stages: dict[str, float] = {}
        self.last = time.perf_counter()

    def stage(self, name: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.stages[name] = (now - self.last) * 1e3
        self.last = now


def _join(worker, host: str, port: int, rank: int, world_size: int) -> float:
    from dagrl.backends.weight_broadcast import BroadcastGroup

    worker.weight_group = BroadcastGroup(host, port, rank, world_size, worker.device)
    return worker.weight_group.bandwidth_gbps()


def _bucket_limit(worker) -> int:
    """rollout.weight_sync_bucket_mb, as the worker's specs carry it (a train or a rollout role's)."""
    sizes = [s.train or s.rollout for s in worker.specs.values()]
    return next(s.weight_sync_bucket_mb for s in sizes if s is not None) * 2**20


def _plan_sends(worker, slots: list[Slot]) -> None:
    if worker.weight_group is not None:
        worker.weight_group.plan = plan_buckets(slots, _bucket_limit(worker))


def _send(worker, src: str, direct: bool) -> tuple[int, dict[str, float]]:
    """Every source worker exports (collectively); the one in the broadcast group sends.
    Returns the bytes sent and the sender's phases (ms)."""
    start = time.perf_counter()
    buckets = worker.activate(src).export_weights()
    group = worker.weight_group
    if group is None:
        for _ in buckets:  # take part in the collective export, keep nothing
            pass
        return 0, {}
    phases = {}
    if direct:
        sent = group.send_direct(group.plan, buckets)
        p = group.phases
        phases = {"export_draw_ms": p.draw_s, "pack_ms": p.copy_s, "send_host_ms": p.host_s}
        phases = {k: v * 1e3 for k, v in phases.items()}
    else:
        sent = group.send(buckets)
    return sent, phases | {"send_ms": (time.perf_counter() - start) * 1e3}


def _receive(
    worker, dst: str, direct: bool, learn: bool
) -> tuple[int, int, float, list[Slot] | str | None, dict[str, float]]:
    """(bytes the engine took, bytes and seconds of the wire, when learning: the slots or why
    not, and the receiver's phases in ms)."""
    start = time.perf_counter()
    backend = worker.activate(dst)
    group = worker.weight_group
    backend.begin_weight_update()
    engine_s, phases = time.perf_counter() - start, {}
    if direct:
        nbytes, learnt = group.receive_direct(group.plan, backend.engine_params()), None
        p = group.phases
        phases = {"wire_ms": p.wire_s, "unpack_ms": p.copy_s, "receive_host_ms": p.host_s}
    else:
        nbytes, learnt = _receive_named(worker, backend, group, learn)
    t = time.perf_counter()
    backend.finish_weight_update()
    phases["engine_ms"] = engine_s + time.perf_counter() - t  # activate, begin and finish
    phases = {k: v * 1e3 for k, v in phases.items()}
    phases["receive_ms"] = (time.perf_counter() - start) * 1e3
    return nbytes, group.transfer_bytes, group.transfer_s, learnt, phases


def _receive_named(worker, backend, group, learn: bool) -> tuple[int, list[Slot] | str | None]:
    """HF-named buckets through the engine's loader; when learning, the map of a direct refresh."""
    params = backend.engine_params() if learn else None
    builder = RecipeBuilder(params) if params is not None else None

    def load(bucket: dict[str, torch.Tensor]) -> int:
        if builder is not None:
            builder.observe(bucket, lambda probes: backend.load_weights([probes]))
        loaded = backend.load_weights([bucket])
        if builder is not None:
            builder.verify(bucket)
        return loaded

    nbytes = group.receive(load)
    learnt = "the rollout engine cannot take weights in place" if learn and builder is None else None
    if builder is not None:
        learnt = builder.finish() or builder.reason
        if not isinstance(learnt, str):
            group.plan = plan_buckets(learnt, _bucket_limit(worker))
    return nbytes, learnt
