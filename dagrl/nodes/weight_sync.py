"""weight_sync: the actor's weights into the rollout engine, as a node of the step.

Colocated (same pool): an in-process copy on each worker, staged (see Worker.sync_weights_local).
Separate pools: every train worker exports (megatron gathers its shards collectively) and train
rank 0 broadcasts the buckets to every rollout worker over a process group of their own (NCCL on
GPUs, gloo on CPU), set up at the first sync, when its plain broadcast speed is measured too.
"""

from __future__ import annotations

import time

import ray

from dagrl.config.placement import ROLE_TRAIN
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind


@register_node_kind("weight_sync")
class WeightSyncNode:
    required_inputs = ()
    optional_inputs = ()
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        self.bandwidth_gbps: float | None = None  # the broadcast group's plain speed, once

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        dst = self.spec.role
        start = time.perf_counter()
        metrics = {}
        if runtime.colocated(ROLE_TRAIN, dst):
            pool = runtime.role(dst).pool
            with pool.lock:
                infos = ray.get([a.sync_weights_local.remote(ROLE_TRAIN, dst) for a in pool.actors])
        else:
            src_pool, dst_pool = runtime.role(ROLE_TRAIN).pool, runtime.role(dst).pool
            with src_pool.lock, dst_pool.lock:
                if self.bandwidth_gbps is None:
                    self.bandwidth_gbps = self._join(src_pool, dst_pool)
                    start = time.perf_counter()  # the set-up is not part of a step's sync
                sends = [a.send_weights.remote(ROLE_TRAIN) for a in src_pool.actors]
                infos = ray.get([a.receive_weights.remote(dst) for a in dst_pool.actors] + sends)
            metrics["weight_sync/broadcast_floor_GBps"] = self.bandwidth_gbps
        seconds = time.perf_counter() - start
        nbytes = infos[0]["bytes"]
        metrics.update(
            {
                "weight_sync/bytes": float(nbytes),
                "weight_sync/s": seconds,
                "weight_sync/GBps": nbytes / max(seconds, 1e-9) / 1e9,
            }
        )
        return NodeResult(Batch(), metrics)

    @staticmethod
    def _join(src_pool, dst_pool) -> float:
        """Train rank 0 (group rank 0) and every rollout worker form the broadcast group."""
        head = src_pool.actors[0]
        host = ray.get(head.node_info.remote())["ip"]
        port = ray.get(head.free_port.remote())
        world = 1 + len(dst_pool.actors)
        joins = [head.weight_group_init.remote(host, port, 0, world)]
        joins += [a.weight_group_init.remote(host, port, 1 + i, world) for i, a in enumerate(dst_pool.actors)]
        return float(ray.get(joins)[0])
