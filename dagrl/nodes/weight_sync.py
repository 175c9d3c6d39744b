"""weight_sync: the actor's weights into the rollout engine, as a node of the step.

Colocated (same pool): an in-process copy on each worker. Separate pools: every train worker
exports (megatron gathers its shards collectively), train rank 0 puts the bucketed weights into
the Ray object store and every rollout worker pulls them bucket by bucket.
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

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        dst = self.spec.role
        start = time.perf_counter()
        if runtime.colocated(ROLE_TRAIN, dst):
            pool = runtime.role(dst).pool
            with pool.lock:
                infos = ray.get([a.sync_weights_local.remote(ROLE_TRAIN, dst) for a in pool.actors])
        else:
            src_pool, dst_pool = runtime.role(ROLE_TRAIN).pool, runtime.role(dst).pool
            with src_pool.lock, dst_pool.lock:
                # every train worker exports (collectively); rank 0's buckets go to every dst worker
                keep = [
                    a.export_weight_refs.remote(ROLE_TRAIN, i == 0) for i, a in enumerate(src_pool.actors)
                ]
                refs = ray.get(keep)[0]
                infos = ray.get([a.load_weight_refs.remote(dst, refs) for a in dst_pool.actors])
        seconds = time.perf_counter() - start
        nbytes = infos[0]["bytes"]
        return NodeResult(
            Batch(),
            {
                "weight_sync/bytes": float(nbytes),
                "weight_sync/s": seconds,
                "weight_sync/GBps": nbytes / max(seconds, 1e-9) / 1e9,
            },
        )
