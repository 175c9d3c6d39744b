"""Ray placement of a plan, worker pools, and role handles that shard batches over DP.

One placement group holds a bundle per planned slot. Bundles are ordered by the node Ray put
them on, so planned slot s (node s // n_gpus_per_node) maps to the s-th bundle in that order and
slots of one planned node stay on one real node. Pools may span nodes of a Ray cluster.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dagrl.config.placement import GroupPlan, Plan
from dagrl.console import log
from dagrl.core.affinity import worker_affinity
from dagrl.core.batch import Batch, Held
from dagrl.core.calls import Collect, Dispatch, Execute, call_spec, collect_results, dispatch_shards
from dagrl.core.device_faults import from_task_error, rank_of
from dagrl.core.failures import from_worker
from dagrl.core.residency import HeldSource, Keep, StepData, tensor_bytes
from dagrl.core.worker_death import worker_died
from dagrl.errors import PlacementError


@dataclass
class Bundles:
    pg: object
    order: list[int]  # planned device slot -> bundle index
    cpus_per_slot: int
    cpu_slots: dict[int, int] = field(default_factory=dict)  # CPU-group slot -> bundle index

    def release(self) -> None:
        remove_placement_group(self.pg)

    def strategy(self, slot: int) -> PlacementGroupSchedulingStrategy:
        index = self.cpu_slots[slot] if slot in self.cpu_slots else self.order[slot]
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)


def allocate(plan: Plan, timeout_s: float = 120.0) -> Bundles:
    """Reserve the plan's slots in Ray; a clear error if the cluster cannot hold them."""
    resources = ray.cluster_resources()
    need_gpu = plan.device == "cuda"
    slots = plan.device_slots
    cpu_workers = len(_cpu_group_slots(plan))
    if need_gpu:
        have = int(resources.get("GPU", 0))
        cpus = max(1, int(resources.get("CPU", 1)) // max(1, plan.total_slots))
        bundle = {"GPU": 1, "CPU": min(cpus, 4)}
    else:
        have = int(resources.get("CPU", 0))
        cpus = max(1, (have - cpu_workers) // max(1, slots))
        bundle = {"CPU": cpus}
    if have < slots:
        kind = "GPU" if need_gpu else "CPU"
        raise PlacementError(
            f"the plan needs {slots} {kind} slots but the Ray cluster has {have} {kind}s"
            f" ({resources}); lower trainer.nnodes × trainer.n_gpus_per_node or placement.gpus, or add nodes"
        )
    # CPU groups of device_groups: one CPU each, after the device slots (slot ids continue from there)
    cpu_bundles = [{"CPU": 1} for _ in range(cpu_workers)]
    pg = placement_group([dict(bundle) for _ in range(slots)] + cpu_bundles, strategy="PACK")
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
    device_bundles = [b for b in node_of if b < slots]
    order = sorted(device_bundles, key=lambda b: (first_seen[node_of[b]], b))
    cpu_slots = {s: slots + k for k, s in enumerate(_cpu_group_slots(plan))}
    return Bundles(pg=pg, order=order, cpus_per_slot=bundle["CPU"], cpu_slots=cpu_slots)


def _cpu_group_slots(plan: Plan) -> list[int]:
    return [s for g in plan.groups if g.device == "cpu" for s in g.slots]


def describe_placement(roles: list[str], infos: list[dict]) -> str:
    """One line naming where each rank of a pool landed: on a multi-node cluster the plan's node
    numbers are Ray's choice, so the run says which node and card each role actually got."""
    ranks = "; ".join(
        f"rank {i} node {info['node_id'][:8]} ({info['ip']}) GPU {','.join(info['gpu_ids']) or '-'}"
        for i, info in enumerate(infos)
    )
    return f"placed {','.join(str(r) for r in roles)}: {ranks}"


class WorkerPool:
    """The actors of one colocate group: one per slot, ranks in slot order.

    `lock` serialises calls into the pool from concurrent DAG nodes. Without it, two nodes on one
    pool (old_logprob and ref_logprob) could reach the workers in different orders, and a
    sharded backend's collectives would pair one role's all-reduce on rank 0 with the other
    role's on rank 1: silently wrong numbers, or a hang.
    """

    def __init__(
        self,
        group: GroupPlan,
        bundles: Bundles,
        plan: Plan,
        cfg,
        actor_cls=None,
        setup: bool = True,
        build=None,
        startup: list[str] | None = None,
        objectives: dict[str, Any] | None = None,
    ):
        """build(spec, ctx, objective) -> backend runs in each worker (dagrl.backends.build_backend)
        on the role's spec in `plan.specs` and its entry in `objectives` (trained roles);
        `startup`: the group's roles in the order the workers build them (None = as listed)."""
        from dagrl.core.worker import RoleParts, Worker, WorkerParts

        cls = actor_cls or Worker
        self.roles = list(group.roles)
        objectives = objectives or {}
        parts = WorkerParts.pack(
            list(cfg.external_plugins),
            {r: RoleParts(plan.specs[r], objectives.get(r)) for r in self.roles},
        )
        self.lock = threading.Lock()
        self.infos: list[dict] = []  # node_info of each rank, to name a dead worker's node
        # set by the weight-sync service once this pool has joined a trainer -> rollout broadcast group
        self.broadcast_floor_gbps: float | None = None
        self.weight_direct = False  # ... and learnt its engines' layout (weights go straight in)
        self.cfg = cfg
        remote = ray.remote(cls)
        self.actors = []
        device = plan.device_of(group)
        self.device = device
        cpus = 1 if group.device == "cpu" else bundles.cpus_per_slot
        affinity = worker_affinity(cfg.trainer.cpu_affinity, device)
        for rank, slot in enumerate(group.slots):
            options = dict(scheduling_strategy=bundles.strategy(slot), num_cpus=cpus)
            if device == "cuda":
                options["num_gpus"] = 1
            self.actors.append(
                remote.options(**options).remote(
                    parts,
                    startup or self.roles,
                    rank,
                    len(group.slots),
                    device,
                    cpus,
                    build,
                    cpu_affinity=affinity,
                )
            )
        if setup:
            try:
                self.setup()
            except BaseException:
                self.shutdown()  # the actors started so far hold bundles of the placement group
                raise

    def setup(self) -> None:
        self.infos = self.get([a.node_info.remote() for a in self.actors])
        log(describe_placement(self.roles, self.infos))
        port = self.get(self.actors[0].free_port.remote())
        self.get([a.setup.remote(self.infos[0]["ip"], port) for a in self.actors])

    def node_info(self) -> list[dict]:
        return self.get([a.node_info.remote() for a in self.actors])

    def get(self, refs):
        """ray.get for calls into this pool: a dead worker becomes one WorkerDiedError line
        naming role, rank, node and its last error (instead of Ray's actor-id paragraph); an
        engine or device failure one DeviceError line (dagrl/core/device_faults.py)."""
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise worker_died(exc, [self]) from exc
        except ray.exceptions.RayTaskError as exc:  # vLLM start refusal, CUDA OOM, NCCL: one line
            error = from_task_error(exc, self)
            if error is None:  # not an engine/device fault: still one line, the traceback logged
                raise from_worker(exc, "+".join(self.roles), rank_of(exc, self)) from None
            # the other ranks' copies of the same failure would print as "unhandled errors"
            os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
            raise error from None

    def memory_report(self) -> dict[str, float]:
        """Rank 0's device samples at each hand-over since the last report (Worker.settle): the
        same points every step, so a leak shows as a climb. Empty off the GPU."""
        if self.device != "cuda":
            return {}
        with self.lock:
            return self.get(self.actors[0].memory_report.remote())

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to leave its process group, wait up to timeout_s for all of them
        together (a busy or dead one does not hold up the rest), then kill them all."""
        refs = [a.shutdown.remote() for a in self.actors]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for a in self.actors:
            ray.kill(a)


class RoleHandle:
    """A role's view of its pool. `call` runs a backend method declared with `@role_method`
    (dagrl/core/calls.py) the way it declares: which data each worker gets, which workers run,
    how the results are joined. Typed subclasses (dagrl/backends/handles.py) name the calls the
    engine makes, so readers and type checkers can follow them.

    Bound to a node of a run (`bound`), a call also counts the tensor bytes that cross to and
    from the driver and keeps the outputs the run's plan names on the workers
    (dagrl/core/residency.py)."""

    def __init__(self, role: str, pool: WorkerPool):
        self.role, self.pool = role, pool
        self.ranks: list[tuple[int, int, bool]] = pool.get([a.dp_info.remote(role) for a in pool.actors])
        self.dp_size = self.ranks[0][1]
        self.step: StepData | None = None  # the run this view calls for (bound)
        self.keep: Keep | None = None  # what its node's outputs leave on the workers

    @property
    def workers(self) -> int:
        return len(self.pool.actors)

    def bound(self, step: StepData, node: str) -> RoleHandle:
        """This handle as node `node` of run `step` calls it: bytes counted, outputs kept per plan."""
        view = copy.copy(self)
        view.step, view.keep = step, step.keep.get(node)
        return view

    def call(self, method: Callable, *args, **kwargs) -> Any:
        """Run `method` (a function declared with @role_method) on the role's workers."""
        spec = call_spec(method)
        running = [0] if spec.execute == Execute.first else list(range(self.workers))
        # only a DP-sliced call on every worker reads or leaves DP pieces in place
        sliced = (spec.dispatch, spec.execute, spec.collect) == (Dispatch.slice, Execute.all, Collect.flatten)
        keep = {"keep": self.keep} if sliced and self.keep is not None else {}
        sent = 0
        if args:
            data = self._in_place(args[0], running) if sliced else _materialized(args[0])
            shards = dispatch_shards(spec, data, self.ranks, running)
            refs, sent = _put_once(shards)
            calls = [(refs[i], *args[1:]) for i in range(len(running))]
        else:
            calls = [() for _ in running]
        with self.pool.lock:
            results = self.pool.get(
                [
                    self.pool.actors[w].call.remote(self.role, method.__name__, *a, **kwargs, **keep)
                    for w, a in zip(running, calls)
                ]
            )
        out = collect_results(spec, results, [self.ranks[w] for w in running])
        if self.step is not None:
            self.step.count(driver=sent + tensor_bytes(results))
        if keep:
            self._locate(out, results, running)
            if self.keep.store and args:
                self._stored(data, running)
        return out

    def _stored(self, data: Any, running: list[int]) -> None:
        """Note the input columns this call's workers stored (Keep.store) as held, values kept."""
        if not isinstance(data, Batch):
            return
        assert self.step is not None
        for key in self.keep.store & data.tensors.keys():
            value = data.tensors[key]
            held = Held(self.step.run, key, len(value), self.dp_size, None, tensor_bytes(value), value)
            held.source = HeldSource(self.pool, list(self.ranks), tuple(running), self.step)
            self.step.stored(key, held)
        self.step.holds(self.pool)

    def _in_place(self, data: Any, running: list[int]) -> Any:
        """`data` with the held columns this call's workers can read in place left held (from
        their stores), those handed over through the object store left held (each worker gets its
        rows' refs), the others fetched (another pool or DP layout, a worker that holds no piece)."""
        if not isinstance(data, Batch) or not data.held:
            return data
        held, fetched = {}, {}
        for key, h in data.held.items():
            if h.source is not None and h.source.readable_by(self, running):
                held[key] = replace(h, refs=()) if h.refs else h  # the own store, not the object store
            elif h.refs:
                held[key] = h
                if h.source is not None:  # the workers keep what they get until the run ends
                    h.source.step.holds(self.pool)
            else:
                fetched[key] = h.materialize()
        if not fetched and all(held[k] is h for k, h in data.held.items()):
            return data
        tensors = {**data.tensors, **fetched}
        return Batch(tensors, data.meta, held, data.repeats_of(tensors))

    def _locate(self, out: Any, results: list, running: list[int]) -> None:
        """Tell the held columns of a call's output where their pieces are, and count them kept."""
        batch = out[0] if isinstance(out, tuple) else out
        if not isinstance(batch, Batch) or not batch.held:
            return
        assert self.step is not None
        for key, held in batch.held.items():
            stored = key in self.keep.stay
            holders = tuple(w for w, r in zip(running, results) if stored and key in _batch_of(r).held)
            held.source = HeldSource(self.pool, list(self.ranks), holders, self.step)
            if stored and held.value is None:
                self.step.count(kept=held.nbytes)
            if held.refs:
                self.step.count(handed=held.nbytes)
        self.step.holds(self.pool)


def _batch_of(result: Any) -> Batch:
    first = result[0] if isinstance(result, tuple) else result
    return first if isinstance(first, Batch) else Batch()


def _materialized(data: Any) -> Any:
    return data.materialized() if isinstance(data, Batch) else data


def _put_once(shards: list) -> tuple[list, int]:
    """Batches go to the object store once each (a shard sent to several TP ranks is shared), held
    pieces without their values (the workers read their own), marked columns as their distinct
    rows (the workers expand them); returns the refs and the tensor bytes put."""
    stored: dict[int, object] = {}
    out, sent = [], 0
    for shard in shards:
        if isinstance(shard, Batch):
            if id(shard) not in stored:
                bare = {k: replace(h, value=None) for k, h in shard.held.items()}
                wire = shard.compacted()
                sending = Batch(wire.tensors, wire.meta, bare) if bare else wire
                sent += tensor_bytes(sending)
                stored[id(shard)] = ray.put(sending)
            out.append(stored[id(shard)])
        else:
            sent += tensor_bytes(shard)
            out.append(shard)
    return out, sent
