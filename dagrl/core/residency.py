"""Data stays where it is used: outputs whose consumers run in the producer's processes stay there.

A remote node's outputs used to return to the driver and be put again for the next node, even
when both ran on the same workers: a colocated teacher's hidden states for full-vocabulary GKD
(~4 GiB per 1M-token step) went worker → driver → worker, and so did the old log-probs computed
on the train workers for the update on the same workers. Now, per run of a DAG:

    plan (Scheduler, once per set of nodes):  key K of remote node N on pool P is
        stay    when every consumer reads it on P's workers with N's DP layout (or, on the
                driver, only as an optional input it may not read),
        mirror  when, besides such consumers, the driver needs it (a driver node requires it),
        plain   otherwise (as before: back to the driver, sent again).
    produce (Worker.call with a `Keep`):  each worker stores its DP shard of K under (run, K) in
        its `WorkerStore`; the driver gets a `Held` column: rows, DP size, which workers hold it,
        and the values too for a mirrored key.
    consume (RoleHandle.call):  a call on the same pool with the same DP layout that slices its
        data over DP sends rank r only "DP rank r's piece of K" (`Held.part == r`); the worker
        reads its own store. Any other reader (another pool, another layout, a driver node, an
        `index` on the driver) fetches the column from the holders first: the values are always
        there when asked for, just not moved when nobody asks.
    free (end of the run, also on failure):  every pool that stored entries drops the run's.

The data's own columns (the DAG's `source`: prompts, their mask, ...) are planned the same way
(`plan_inputs`): a source key read by several remote nodes on one place is stored by the workers
of the first of them (`Keep.store`: each keeps the DP shard it was sent) and, for the readers that
start after that call, the driver holds it as a `Held` column that still has its values (driver
nodes read it as before); their calls send "your piece of K" only. The driver substitutes the
column only where its batch still has the very tensor that was sent (`StepData.held_inputs`).

`perf/driver_bytes` counts the tensor bytes that cross to or from the driver in a run (shards put,
results got, columns fetched); `perf/kept_bytes` what stayed on the workers instead.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from dagrl.core.batch import Batch, Held


@dataclass(frozen=True)
class Keep:
    """What the workers of one call keep of its outputs until run `run` ends: `stay` keys only
    there, `mirror` keys there and on the driver."""

    run: str
    stay: frozenset[str] = frozenset()
    mirror: frozenset[str] = frozenset()
    store: frozenset[str] = frozenset()  # input keys each worker keeps of the shard it was sent


@dataclass
class StepData:
    """The driver's ledger of one run of a DAG: which outputs each node keeps on its workers, the
    bytes that crossed to/from the driver, and the pools to free at the end."""

    run: str
    keep: dict[str, Keep] = field(default_factory=dict)  # node name -> what its workers keep
    driver_bytes: int = 0
    kept_bytes: int = 0
    pools: list = field(default_factory=list)  # WorkerPools holding entries of this run
    inputs: dict[str, Held] = field(default_factory=dict)  # stored input columns, values kept
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stored(self, key: str, held: Held) -> None:
        with self.lock:
            self.inputs.setdefault(key, held)

    def held_inputs(self, batch: Batch) -> Batch:
        """`batch` with each column that workers stored in this run (the same tensor that was sent)
        as a `Held` column holding its values: a call on those workers sends the pieces only."""
        with self.lock:
            swap = {k: h for k, h in self.inputs.items() if batch.tensors.get(k) is h.value}
        if not swap:
            return batch
        tensors = {k: v for k, v in batch.tensors.items() if k not in swap}
        return Batch(tensors, batch.meta, {**batch.held, **swap})

    def count(self, driver: int = 0, kept: int = 0) -> None:
        with self.lock:
            self.driver_bytes += driver
            self.kept_bytes += kept

    def holds(self, pool) -> None:
        with self.lock:
            if all(p is not pool for p in self.pools):
                self.pools.append(pool)

    def metrics(self) -> dict[str, float]:
        return {"perf/driver_bytes": float(self.driver_bytes), "perf/kept_bytes": float(self.kept_bytes)}

    def free(self, wait: bool) -> None:
        """Drop this run's entries on every pool that holds some. `wait=False` (a failed step: a
        worker may be dead or busy) sends the drop and goes on; the workers also refuse entries
        that arrive for a run already dropped."""
        for pool in self.pools:
            refs = [a.drop_local.remote(self.run) for a in pool.actors]
            if wait:
                pool.get(refs)


def plan_residency(dag, roles: dict, names: set[str]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """(stay, mirror) outputs per remote node among `names`, for `roles` (role -> RoleHandle).

    A key stays when it has at least one consumer in `names` that is a remote node on the producer's
    pool with the producer's DP layout, and every other consumer is a driver node that only may
    read it (an optional input); it is mirrored when some driver node requires it or some remote
    consumer cannot read it in place. Keys nobody in `names` reads (the caller may want them) and
    keys read by nodes outside `names` (a later partial run) go back to the driver as before."""
    nodes = [s for s in dag.nodes if s.name in names]
    plan: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for producer in nodes:
        if not producer.role or producer.role not in roles:
            continue
        home = roles[producer.role]
        stay, mirror = set(), set()
        for key in producer.outputs:
            readers = [s for s in dag.nodes if key in s.inputs]
            if not readers or any(s.name not in names for s in readers):
                continue
            local = [s for s in readers if s.role in roles and _same_place(home, roles[s.role])]
            if not local:
                continue
            others = [s for s in readers if s not in local]
            if all(not s.role and key not in (s.required_inputs or ()) for s in others):
                stay.add(key)
            else:
                mirror.add(key)
        if stay or mirror:
            plan[producer.name] = (frozenset(stay), frozenset(mirror))
    return plan


def plan_inputs(dag, roles: dict, names: set[str]) -> dict[str, frozenset[str]]:
    """The source keys each remote node among `names` stores on its workers: a key read by several
    remote nodes in one place (pool and DP layout) is stored by the one of them that most of the
    others wait for (directly or not); those start after it and read it in place."""
    before = _ancestors(dag)
    nodes = [s for s in dag.nodes if s.name in names and s.role in roles]
    plan: dict[str, set[str]] = {}
    for key in dag.source:
        readers = [s for s in nodes if key in s.inputs]
        for reader in readers:
            here = [s for s in readers if _same_place(roles[s.role], roles[reader.role])]
            later = sum(reader.name in before[s.name] for s in here)
            best = max(here, key=lambda s: sum(s.name in before[o.name] for o in here))
            if later and best is reader:
                plan.setdefault(reader.name, set()).add(key)
    return {node: frozenset(keys) for node, keys in plan.items()}


def _ancestors(dag) -> dict[str, set[str]]:
    """Every node's transitive dependencies (dag.nodes are in topological order)."""
    out: dict[str, set[str]] = {}
    for spec in dag.nodes:
        out[spec.name] = set(dag.deps[spec.name]).union(*(out[d] for d in dag.deps[spec.name]))
    return out


def _same_place(a, b) -> bool:
    """Two roles whose calls reach the same processes with the same DP shards."""
    return a.pool is b.pool and list(a.ranks) == list(b.ranks)


@dataclass
class HeldSource:
    """Where a held column is, on the driver: the pool, the producer's DP layout, the workers that
    hold a piece, and the run's ledger (fetches count as driver bytes)."""

    pool: object
    ranks: list[tuple[int, int, bool]]
    holders: tuple[int, ...]
    step: StepData
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def readable_by(self, handle, running: list[int]) -> bool:
        """Whether `handle`'s workers `running` can each read their DP piece in place."""
        return _same_place(self, handle) and set(running) <= set(self.holders)

    def fetch(self, held: Held) -> torch.Tensor:
        """The whole column from one holder per DP rank, in DP order."""
        order = sorted((self.ranks[w][0], w) for w in self.holders if self.ranks[w][2])
        assert [r for r, _ in order] == list(range(held.dp_size)), f"{held.key}: no holder for some DP rank"
        pieces = self.pool.get([self.pool.actors[w].fetch_local.remote(held.run, held.key) for _, w in order])
        value = torch.cat(pieces)
        self.step.count(driver=tensor_bytes(value))
        return value


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a call's argument or result (Batches, Held values, tuples, lists)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Batch):
        held = [h.value for h in obj.held.values() if h.value is not None]
        return sum(tensor_bytes(t) for t in (*obj.tensors.values(), *held))
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(x) for x in obj)
    return 0


class WorkerStore:
    """A worker's entries of the runs in progress: (run, key) -> this worker's piece of a column."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], torch.Tensor] = {}
        self.dropped: deque[str] = deque(maxlen=64)  # a late store for a finished run is refused

    def keep(self, result, keep: Keep, dp_rank: int, dp_size: int):
        """Store the kept keys of a call's result; the result then holds `Held` pieces in their place
        (with the values for mirrored keys)."""
        batch, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, None)
        if not isinstance(batch, Batch) or keep.run in self.dropped:
            return result
        tensors, held = dict(batch.tensors), dict(batch.held)
        for key in (keep.stay | keep.mirror) & tensors.keys():
            if (keep.run, key) in self.entries:  # a node calling twice (chunks): the first call's stays
                continue
            value = tensors.pop(key)
            self.entries[(keep.run, key)] = value
            mirrored = value if key in keep.mirror else None
            held[key] = Held(keep.run, key, len(value), dp_size, dp_rank, tensor_bytes(value), mirrored)
        out = Batch(tensors, batch.meta, held)
        return out if rest is None else (out, *rest)

    def keep_inputs(self, batch, keep: Keep) -> None:
        """Store this worker's shard of the input columns `keep.store` names (a call's data)."""
        if not isinstance(batch, Batch) or keep.run in self.dropped:
            return
        for key in keep.store & batch.tensors.keys():
            self.entries.setdefault((keep.run, key), batch.tensors[key])

    def resolve(self, batch: Batch, dp_rank: int) -> Batch:
        """The batch with each held piece replaced by this worker's stored tensor."""
        tensors = dict(batch.tensors)
        for key, held in batch.held.items():
            assert held.part == dp_rank, f"{key}: piece of DP rank {held.part} sent to DP rank {dp_rank}"
            value = self.entries.get((held.run, held.key))
            assert value is not None, f"{key} of run {held.run} is not on this worker (freed or never kept)"
            assert len(value) == held.rows, f"{key}: {len(value)} rows here, {held.rows} expected"
            tensors[key] = value
        return Batch(tensors, batch.meta)

    def get(self, run: str, key: str) -> torch.Tensor:
        return self.entries[(run, key)]

    def drop(self, run: str) -> int:
        """Free a run's entries; returns how many there were."""
        self.dropped.append(run)
        gone = [k for k in self.entries if k[0] == run]
        for k in gone:
            del self.entries[k]
        return len(gone)
