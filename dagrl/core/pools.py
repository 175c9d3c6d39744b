"""Ray placement of a plan, worker pools, and role handles that shard batches over DP.

One placement group holds a bundle per planned slot. Bundles are ordered by the node Ray put
them on, so planned slot s (node s // n_gpus_per_node) maps to the s-th bundle in that order and
slots of one planned node stay on one real node. Pools may span nodes of a Ray cluster.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dagrl.config.placement import GroupPlan, Plan
from dagrl.core.batch import Batch
from dagrl.core.worker_death import worker_died
from dagrl.errors import PlacementError


@dataclass
class Bundles:
    pg: object
    order: list[int]  # planned slot -> bundle index
    cpus_per_slot: int

    def release(self) -> None:
        remove_placement_group(self.pg)

    def strategy(self, slot: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=self.order[slot]
        )


def allocate(plan: Plan, timeout_s: float = 120.0) -> Bundles:
    """Reserve the plan's slots in Ray; a clear error if the cluster cannot hold them."""
    resources = ray.cluster_resources()
    need_gpu = plan.device == "cuda"
    if need_gpu:
        have = int(resources.get("GPU", 0))
        cpus = max(1, int(resources.get("CPU", 1)) // max(1, plan.total_slots))
        bundle = {"GPU": 1, "CPU": min(cpus, 4)}
    else:
        have = int(resources.get("CPU", 0))
        cpus = max(1, have // max(1, plan.total_slots))
        bundle = {"CPU": cpus}
    if have < plan.total_slots:
        kind = "GPU" if need_gpu else "CPU"
        raise PlacementError(
            f"the plan needs {plan.total_slots} {kind} slots but the Ray cluster has {have} {kind}s"
            f" ({resources}); lower trainer.nnodes × trainer.n_gpus_per_node or placement.gpus, or add nodes"
        )
    pg = placement_group([dict(bundle) for _ in range(plan.total_slots)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(
            f"Ray could not place {plan.total_slots} bundles of {bundle} in {timeout_s:.0f}s"
        )
    node_of = placement_group_table(pg)["bundles_to_node_id"]
    first_seen: dict[str, int] = {}
    for b in sorted(node_of):
        first_seen.setdefault(node_of[b], b)
    order = sorted(node_of, key=lambda b: (first_seen[node_of[b]], b))
    return Bundles(pg=pg, order=order, cpus_per_slot=bundle["CPU"])


class WorkerPool:
    """The actors of one colocate group: one per slot, ranks in slot order.

    `lock` serialises calls into the pool from concurrent DAG nodes. Without it, two nodes on one
    pool (old_logprob and ref_logprob) could reach the workers in different orders, and a
    sharded backend's collectives would pair one role's all-reduce on rank 0 with the other
    role's on rank 1: silently wrong numbers, or a hang.
    """

    def __init__(
        self, group: GroupPlan, bundles: Bundles, plan: Plan, cfg, actor_cls=None, setup: bool = True
    ):
        from dagrl.core.worker import Worker

        cls = actor_cls or Worker
        self.roles = list(group.roles)
        self.lock = threading.Lock()
        self.infos: list[dict] = []  # node_info of each rank, to name a dead worker's node
        remote = ray.remote(cls)
        self.actors = []
        for rank, slot in enumerate(group.slots):
            options = dict(scheduling_strategy=bundles.strategy(slot), num_cpus=bundles.cpus_per_slot)
            if plan.device == "cuda":
                options["num_gpus"] = 1
            self.actors.append(
                remote.options(**options).remote(
                    cfg, self.roles, rank, len(group.slots), plan.device, bundles.cpus_per_slot
                )
            )
        if setup:
            self.setup()

    def setup(self) -> None:
        self.infos = self.get([a.node_info.remote() for a in self.actors])
        port = self.get(self.actors[0].free_port.remote())
        self.get([a.setup.remote(self.infos[0]["ip"], port) for a in self.actors])

    def node_info(self) -> list[dict]:
        return self.get([a.node_info.remote() for a in self.actors])

    def get(self, refs):
        """ray.get for calls into this pool: a dead worker becomes one WorkerDiedError line
        naming role, rank, node and its last error (instead of Ray's actor-id paragraph)."""
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise worker_died(exc, [self]) from exc

    def call_all(self, role: str, method: str, *args, **kwargs) -> list:
        with self.lock:
            return self.get([a.call.remote(role, method, *args, **kwargs) for a in self.actors])

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to leave its process group, wait up to timeout_s for all of them
        together (a busy or dead one does not hold up the rest), then kill them all."""
        refs = [a.shutdown.remote() for a in self.actors]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for a in self.actors:
            ray.kill(a)


class RoleHandle:
    """A role's view of its pool: splits a batch over the role's DP ranks and gathers the outputs."""

    def __init__(self, role: str, pool: WorkerPool):
        self.role, self.pool = role, pool
        self.dp_info = pool.get([a.dp_info.remote(role) for a in pool.actors])
        self.dp_size = self.dp_info[0][1]

    def run(self, method: str, batch: Batch, **kwargs) -> tuple[Batch, list[dict]]:
        """Each DP shard through `method`; returns (concatenated output batch, per-rank metrics)."""
        shards = [ray.put(s) for s in batch.split(self.dp_size)]
        with self.pool.lock:
            futures = [
                a.call.remote(self.role, method, shards[dp_rank], **kwargs)
                for a, (dp_rank, _, _) in zip(self.pool.actors, self.dp_info)
            ]
            results = self.pool.get(futures)
        outputs = sorted(
            ((dp_rank, r) for r, (dp_rank, _, returns) in zip(results, self.dp_info) if returns),
            key=lambda x: x[0],
        )
        return Batch.concat([r[0] for _, r in outputs]), [r[1] for _, r in outputs]

    def broadcast(self, method: str, *args, **kwargs) -> list:
        return self.pool.call_all(self.role, method, *args, **kwargs)
