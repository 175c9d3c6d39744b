"""Runs one step's DAG: each node starts as soon as the nodes it depends on have finished.

Dataflow of the GRPO step (conf/dags/grpo.yaml); `==>` is data, `-->` ordering only:

    data ==> prompts, prompt_mask, group_ids, data_source, ground_truth, extra_info
    weight_sync --> rollout [rollout pool]
    rollout ==> responses, response_mask, rollout_logprobs
        ├==> reward      [driver]       ==> scores, token_rewards
        ├==> old_logprob [train pool]   ==> old_logprobs     } these three run concurrently
        └==> ref_logprob [ref pool]     ==> ref_logprobs     }
    scores, group_ids ==> advantage [driver] ==> advantages
    advantages, old_logprobs, ref_logprobs ==> actor_update [train pool]

Remote nodes block a driver thread on `ray.get`; independent nodes therefore overlap whenever
their pools differ. Calls to the same Ray actor queue up on it (colocated roles take turns).
Each node's wall time is reported as `timing_s/<node>`, and the seconds nodes ran alongside
others (their sum beyond the step's wall time) as `timing_s/overlapped`.

Data stays where it is used (dagrl/core/residency.py): an output whose consumers run on the
producer's workers with its DP layout stays there, and the driver only holds a `Held` column
naming it. With train, rollout and ref colocated, `old_logprobs`, `ref_logprobs` and
`rollout_logprobs` never reach the driver (the advantage node reads them only for KL in the
reward, and then they are mirrored: kept and sent); a colocated teacher's `teacher_hidden` or
top-k goes from the teacher straight to the update on the same workers. The run's kept columns
are freed when it ends, also when it fails. An output read on another pool (or DP layout) goes
there through Ray's object store, the driver passing refs (placement=separate: the rollout's
log-probs reach the update without it). `perf/driver_bytes` counts the tensor bytes that crossed
to or from the driver, `perf/kept_bytes` those that stayed, `perf/handed_bytes` those handed over.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from dagrl.core.batch import Batch
from dagrl.core.dag import Dag
from dagrl.core.device_faults import DeviceError
from dagrl.core.failures import at_node
from dagrl.core.node import NodeResult, node_kinds
from dagrl.core.residency import Keep, StepData, plan_inputs, plan_residency
from dagrl.core.runtime import Runtime

_RUNS = itertools.count(1)  # run ids: the kept columns of concurrent runs (overlap, validation) never mix


class Scheduler:
    """Runs one validated `Dag` per step: builds each node once from its kind, then starts every
    node whose dependencies are done on a thread pool (so nodes on different pools overlap) and
    merges their outputs and metrics; see the module docstring for the dataflow."""

    def __init__(self, dag: Dag, runtime: Runtime, max_workers: int = 8):
        kinds = node_kinds()
        self.dag = dag
        self.runtime = runtime
        self.nodes = {spec.name: kinds[spec.kind](spec, runtime.cfg) for spec in dag.nodes}
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dagrl-node")
        # per set of nodes run together: which outputs stay on the workers (residency.plan_residency)
        self.plans: dict[frozenset[str], dict[str, tuple[frozenset[str], ...]]] = {}
        self.input_plans: dict[frozenset[str], dict[str, frozenset[str]]] = {}  # residency.plan_inputs

    def run(
        self, batch: Batch, step: int, only: set[str] | None = None, sample_round: int = 0
    ) -> tuple[Batch, dict[str, float]]:
        """Run every node once for `step` (or those named in `only`: the others count as done, their
        outputs already in `batch`); returns the batch with all outputs (but those that stayed on
        the workers: freed with the run) and the merged metrics. `sample_round` > 0: a further
        rollout of the same step (dynamic sampling), sampled with a seed of its own."""
        names = {s.name for s in self.dag.nodes if only is None or s.name in only}
        data = self._step_data(step, names)
        try:
            batch, metrics = self._run(batch, step, names, data, sample_round)
        except BaseException:
            data.free(wait=False)
            raise
        data.free(wait=True)
        metrics.update(data.metrics())
        return _settled(batch), metrics

    def _step_data(self, step: int, names: set[str]) -> StepData:
        key = frozenset(names)
        if key not in self.plans:
            self.plans[key] = plan_residency(self.dag, self.runtime.roles, names)
        if key not in self.input_plans:
            self.input_plans[key] = plan_inputs(self.dag, self.runtime.roles, names)
        data = StepData(run=f"{step}.{next(_RUNS)}")
        plan, stores = self.plans[key], self.input_plans[key]
        none = frozenset()
        data.keep = {}
        for node in {*plan, *stores}:
            stay, mirror, hand = plan.get(node, (none, none, none))
            data.keep[node] = Keep(data.run, stay, mirror, stores.get(node, none), hand)
        return data

    def _run(
        self, batch: Batch, step: int, names: set[str], data: StepData, sample_round: int = 0
    ) -> tuple[Batch, dict[str, float]]:
        runtime = self.runtime.at_step(step, sample_round)
        metrics: dict[str, float] = {}
        done: set[str] = {s.name for s in self.dag.nodes if s.name not in names}
        running: dict[Future, str] = {}
        started = time.perf_counter()
        while len(done) < len(self.dag.nodes):
            for spec in self.dag.nodes:
                if spec.name in done or spec.name in running.values():
                    continue
                if self.dag.deps[spec.name] <= done:
                    inputs = data.held_inputs(batch.select(spec.inputs))  # stored ones: pieces only
                    view = runtime.at_node(spec.name, data)
                    running[self.pool.submit(self._run_node, view, spec.name, inputs)] = spec.name
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                name = running.pop(fut)
                result, seconds = fut.result()  # re-raises a node's error on the driver
                batch = batch.union(result.batch)
                metrics.update(result.metrics)
                metrics[f"timing_s/{name}"] = seconds
                done.add(name)
        if len(names) == len(self.dag.nodes):
            wall = time.perf_counter() - started
            metrics["timing_s/step"] = wall
            # node seconds that ran alongside others (e.g. a standalone teacher while the reward is
            # computed): the sum of node times beyond the step's wall time
            busy = sum(v for k, v in metrics.items() if k.startswith("timing_s/") and k != "timing_s/step")
            metrics["timing_s/overlapped"] = max(0.0, busy - wall)
        return batch, metrics

    def _run_node(self, runtime: Runtime, name: str, inputs: Batch) -> tuple[NodeResult, float]:
        start = time.perf_counter()
        spec = self.dag.node(name)
        try:
            result = self.nodes[name].run(runtime, inputs)
        except DeviceError as exc:  # an engine/device failure: name the node it happened in
            exc.node = exc.node or f"{name} (kind {spec.kind})"
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin's or a backend's: one line naming the node
            role = f", role {spec.role}" if spec.role else ", on the driver"
            failure = at_node(exc, f"{name} (kind {spec.kind}{role})")
            if failure is exc:
                raise
            raise failure from exc
        produced, declared = result.batch.keys(), set(spec.outputs)
        assert produced == declared, f"node {name} produced {sorted(produced)}, declared {sorted(declared)}"
        return result, time.perf_counter() - start

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _settled(batch: Batch) -> Batch:
    """What a run returns: held columns the driver has as tensors, those it has not dropped (their
    entries are freed with the run)."""
    if not batch.held:
        return batch
    kept = {k: h.value for k, h in batch.held.items() if h.value is not None}
    return Batch({**batch.tensors, **kept}, batch.meta)
