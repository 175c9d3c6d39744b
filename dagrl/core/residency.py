"""Data stays where it is used: outputs whose consumers run in the producer's processes stay there.

A remote node's outputs used to return to the driver and be put again for the next node, even
when both ran on the same workers: a colocated teacher's hidden states for full-vocabulary GKD
(~4 GiB per 1M-token step) went worker → driver → worker, and so did the old log-probs computed
on the train workers for the update on the same workers. Now, per run of a DAG:

    plan (Scheduler, once per set of nodes):  key K of remote node N on pool P, read by nodes
        of this run only, is
        stay    when some consumer reads it on P's workers with N's DP layout: stored there,
        hand    when some consumer is a remote node elsewhere (another pool, another DP layout):
                handed over through Ray's object store,
        mirror  besides (one of) those, when a driver node requires it: the values come back too,
        plain   when neither (as before: back to the driver, sent again).
    produce (Worker.call with a `Keep`):  each worker stores its DP shard of a `stay` key under
        (run, K) in its `WorkerStore`; for a `hand` key each worker that returns output (one per
        DP rank) `ray.put`s its shard (a CPU tensor) and returns the object ref. The driver gets a
        `Held` column: rows, DP size, which workers hold it, the refs, the values if mirrored.
    consume (RoleHandle.call):  a call on the same pool with the same DP layout that slices its
        data over DP sends rank r only "DP rank r's piece of K" (`Held.part == r`); the worker
        reads its own store. A DP-sliced call elsewhere gets, for a handed-over key, the refs and
        row ranges of its rows (`Held.pieces`, any DP size) and `ray.get`s them in the worker,
        each object once per run however many nodes there read it (`WorkerStore.fetched`):
        the pieces go from pool to pool, the driver passes refs. Any other reader (a driver
        node, an `index` on the driver, a call not sliced over DP) fetches the column first:
        the values are always there when asked for, just not moved when nobody asks.
    free (end of the run, also on failure):  every pool that stored entries or got handed-over
        objects drops the run's;
        the objects handed over are freed by Ray once the run's batch (its refs) is dropped.

The data's own columns (the DAG's `source`: prompts, their mask, ...) are planned the same way
(`plan_inputs`): a source key read by several remote nodes on one place is stored by the workers
of the first of them (`Keep.store`: each keeps the DP shard it was sent) and, for the readers that
start after that call, the driver holds it as a `Held` column that still has its values (driver
nodes read it as before); their calls send "your piece of K" only. The driver substitutes the
column only where its batch still has the very tensor that was sent (`StepData.held_inputs`).

The n samples of a prompt (`Batch.repeats`, collate's repeat) travel as the prompt, its tensors
and its meta lists alike: the driver puts the distinct rows (`Batch.compacted`), the worker
expands them before the backend reads the batch (`Worker.call`), row for row what the driver
holds, and leaves them marked as runs (the vLLM rollout samples a run in one request).

`perf/driver_bytes` counts the tensor bytes that cross to or from the driver in a run (shards put,
results got, columns fetched); an object ref the driver passes is not a tensor and counts 0 (it
is an id and its owner's address, some tens of bytes however large the object). What stayed on
the workers instead is `perf/kept_bytes`, what went from pool to pool through the object store
`perf/handed_bytes`.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import ray
import torch

from dagrl.core.batch import Batch, Held, Repeated

BYTE_COUNTERS = ("perf/driver_bytes", "perf/kept_bytes", "perf/handed_bytes")  # StepData.metrics


@dataclass(frozen=True)
class Keep:
    """What the workers of one call keep of its outputs until run `run` ends: `stay` keys in their
    store, `hand` keys in Ray's object store (for other pools), and of those the `mirror` keys
    are also sent to the driver."""

    run: str
    stay: frozenset[str] = frozenset()
    mirror: frozenset[str] = frozenset()
    store: frozenset[str] = frozenset()  # input keys each worker keeps of the shard it was sent
    hand: frozenset[str] = frozenset()


@dataclass
class StepData:
    """The driver's ledger of one run of a DAG: which outputs each node keeps on its workers, the
    bytes that crossed to/from the driver, and the pools to free at the end."""

    run: str
    keep: dict[str, Keep] = field(default_factory=dict)  # node name -> what its workers keep
    driver_bytes: int = 0
    kept_bytes: int = 0
    handed_bytes: int = 0
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
        return Batch(tensors, batch.meta, {**batch.held, **swap}, batch.repeats_of(tensors))

    def count(self, driver: int = 0, kept: int = 0, handed: int = 0) -> None:
        with self.lock:
            self.driver_bytes += driver
            self.kept_bytes += kept
            self.handed_bytes += handed

    def holds(self, pool) -> None:
        with self.lock:
            if all(p is not pool for p in self.pools):
                self.pools.append(pool)

    def metrics(self) -> dict[str, float]:
        counts = (self.driver_bytes, self.kept_bytes, self.handed_bytes)
        return {key: float(count) for key, count in zip(BYTE_COUNTERS, counts)}

    def free(self, wait: bool) -> None:
        """Drop this run's entries on every pool that holds some. `wait=False` (a failed step: a
        worker may be dead or busy) sends the drop and goes on; the workers also refuse entries
        that arrive for a run already dropped."""
        for pool in self.pools:
            refs = [a.drop_local.remote(self.run) for a in pool.actors]
            if wait:
                pool.get(refs)


def plan_residency(dag, roles: dict, names: set[str]) -> dict[str, tuple[frozenset[str], ...]]:
    """(stay, mirror, hand) outputs per remote node among `names`, for `roles` (role -> RoleHandle).

    A key stays (in its workers' stores) when a consumer in `names` is a remote node on the
    producer's pool with the producer's DP layout, and is handed over (through Ray's object store)
    when a consumer is a remote node elsewhere; of those, it is mirrored (sent to the driver too)
    when some driver node requires it, or some consumer has no handle. Keys nobody in `names` reads
    (the caller may want them) and keys read by nodes outside `names` (a later partial run) go
    back to the driver as before."""
    nodes = [s for s in dag.nodes if s.name in names]
    plan: dict[str, tuple[frozenset[str], ...]] = {}
    for producer in nodes:
        if not producer.role or producer.role not in roles:
            continue
        home = roles[producer.role]
        stay, mirror, hand = set(), set(), set()
        for key in producer.outputs:
            readers = [s for s in dag.nodes if key in s.inputs]
            if not readers or any(s.name not in names for s in readers):
                continue
            remote = [s for s in readers if s.role in roles]
            local = [s for s in remote if _same_place(home, roles[s.role])]
            if local:
                stay.add(key)
            if len(local) < len(remote):
                hand.add(key)
            others = [s for s in readers if s not in remote]  # driver nodes, roles without a handle
            if remote and any(s.role or key in (s.required_inputs or ()) for s in others):
                mirror.add(key)
        if stay or hand:
            plan[producer.name] = (frozenset(stay), frozenset(mirror), frozenset(hand))
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
        """The whole column: from the object store when handed over, else from one holder per DP
        rank, in DP order."""
        if held.refs:
            value = from_object_store(held.refs)
            self.step.count(driver=tensor_bytes(value))
            return value
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
    if isinstance(obj, Repeated):
        return tensor_bytes(obj.rows)
    if isinstance(obj, Batch):
        held = [h.value for h in obj.held.values() if h.value is not None]
        return sum(tensor_bytes(t) for t in (*obj.tensors.values(), *held))
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(x) for x in obj)
    return 0


def from_object_store(refs: tuple) -> torch.Tensor:
    """The rows `refs` ((ObjectRef, start, stop), ...) name, in order, as one tensor of its own."""
    return rows_of(ray.get([ref for ref, _, _ in refs]), refs)


def rows_of(values: list[torch.Tensor], refs: tuple) -> torch.Tensor:
    """The rows `refs` name of the objects `values` (one per ref, in order), as one tensor."""
    if len(refs) == 1 and refs[0][1] == 0 and refs[0][2] == len(values[0]):
        return values[0]
    return torch.cat([v[a:b] for v, (_, a, b) in zip(values, refs)])  # a copy, never a view


def _to_host(value: torch.Tensor) -> torch.Tensor:
    """A tensor for Ray's object store: on the host (a CUDA tensor would be rebuilt on whichever
    device the reader's process has as current); the reader moves it to its device, as it does
    with what the driver sends."""
    return value if value.device.type == "cpu" else value.detach().to("cpu")


class WorkerStore:
    """A worker's entries of the runs in progress: (run, key) -> this worker's piece of a column."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], torch.Tensor] = {}
        # (run, ObjectRef) -> the object, got once per run: two nodes here (a teacher and the
        # update) reading one handed-over column would otherwise each fetch and unpickle it
        self.fetched: dict[tuple[str, object], torch.Tensor] = {}
        self.dropped: deque[str] = deque(maxlen=64)  # a late store for a finished run is refused

    def keep(self, result, keep: Keep, dp_rank: int, dp_size: int, returns: bool = True):
        """Store the `stay` keys of a call's result, put its `hand` keys in the object store (only
        where this worker `returns` output: one copy per DP rank); the result then holds `Held`
        pieces in their place (with the values for mirrored keys)."""
        batch, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, None)
        if not isinstance(batch, Batch) or keep.run in self.dropped:
            return result
        tensors, held = dict(batch.tensors), dict(batch.held)
        hand = keep.hand if returns else frozenset()
        for key in keep.hand - hand - keep.stay:  # the driver drops this worker's output (a TP rank)
            tensors.pop(key, None)
        for key in (keep.stay | hand) & tensors.keys():
            if (keep.run, key) in self.entries:  # a node calling twice (chunks): the first call's stays
                continue
            value = tensors.pop(key)
            if key in keep.stay:
                self.entries[(keep.run, key)] = value
            refs = ((ray.put(_to_host(value)), 0, len(value)),) if key in hand else ()
            mirrored = value if key in keep.mirror else None
            nbytes = tensor_bytes(value)
            held[key] = Held(keep.run, key, len(value), dp_size, dp_rank, nbytes, mirrored, refs=refs)
        out = Batch(tensors, batch.meta, held)
        return out if rest is None else (out, *rest)

    def keep_inputs(self, batch, keep: Keep) -> None:
        """Store this worker's shard of the input columns `keep.store` names (a call's data)."""
        if not isinstance(batch, Batch) or keep.run in self.dropped:
            return
        for key in keep.store & batch.tensors.keys():
            self.entries.setdefault((keep.run, key), batch.tensors[key])

    def resolve(self, batch: Batch, dp_rank: int) -> Batch:
        """The batch with each held piece replaced by this worker's stored tensor, or for a piece
        handed over from another pool, its rows from the object store."""
        tensors = dict(batch.tensors)
        for key, held in batch.held.items():
            assert held.part == dp_rank, f"{key}: piece of DP rank {held.part} sent to DP rank {dp_rank}"
            if held.refs:
                tensors[key] = self._handed(held.run, held.refs)
                assert len(tensors[key]) == held.rows, (
                    f"{key}: {len(tensors[key])} rows, {held.rows} expected"
                )
                continue
            value = self.entries.get((held.run, held.key))
            assert value is not None, f"{key} of run {held.run} is not on this worker (freed or never kept)"
            assert len(value) == held.rows, f"{key}: {len(value)} rows here, {held.rows} expected"
            tensors[key] = value
        return Batch(tensors, batch.meta, repeats=batch.repeats)

    def _handed(self, run: str, refs: tuple) -> torch.Tensor:
        """The rows `refs` name, each object got from the object store once in run `run` (kept
        until the run is dropped; a run already dropped keeps nothing)."""
        missing = list(dict.fromkeys(ref for ref, _, _ in refs if (run, ref) not in self.fetched))
        got = dict(zip(missing, ray.get(missing))) if missing else {}
        if run not in self.dropped:
            self.fetched.update({(run, ref): value for ref, value in got.items()})
        values = [got[ref] if ref in got else self.fetched[(run, ref)] for ref, _, _ in refs]
        return rows_of(values, refs)

    def get(self, run: str, key: str) -> torch.Tensor:
        return self.entries[(run, key)]

    def drop(self, run: str) -> int:
        """Free a run's entries (and the objects it got from the object store); returns how many
        entries there were."""
        self.dropped.append(run)
        gone = [k for k in self.entries if k[0] == run]
        for k in gone:
            del self.entries[k]
        for k in [k for k in self.fetched if k[0] == run]:
            del self.fetched[k]
        return len(gone)
