"""Typed calls: every dispatch / execute / collect mode against a pool of real Ray workers
(dagrl's Worker hosting a plugin role registered in tests/plugins/echo_role.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dagrl.backends import build_backend
from dagrl.config.placement import make_plan
from dagrl.core.batch import Batch
from dagrl.core.calls import CallSpec, Collect, Dispatch, Execute, collect_results, dispatch_shards
from dagrl.core.pools import RoleHandle, WorkerPool, allocate
from tests.conftest import compose_config, start_local_ray
from tests.plugins.echo_role import CounterRole

WORKERS = 2  # the session Ray's 2 CPU slots: a Ray of the module's own cost seconds to start
PLANNED_MICRO_BATCH = 5  # the config leaves roles.echo at 1
OBJECTIVE = ("an objective", 7)  # what the driver built for the role: it travels as built


@pytest.fixture(scope="module")
def echo_handle():
    start_local_ray()
    cfg = compose_config(
        "external_plugins=[tests.plugins.echo_role]",
        "+roles.echo=counter",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={WORKERS}",
    )
    plan = make_plan(cfg, {"echo"}, "cpu")
    # the plan's spec differs from what the config decodes to (as after the plan's automatic
    # choices), and the role gets an objective: the workers must build from these, not the config
    plan.specs["echo"] = replace(plan.specs["echo"], micro_batch_size=PLANNED_MICRO_BATCH)
    bundles = allocate(plan, timeout_s=60)
    objectives = {"echo": OBJECTIVE}
    pool = WorkerPool(plan.groups[0], bundles, plan, cfg, build=build_backend, objectives=objectives)
    try:
        yield RoleHandle("echo", pool)
    finally:
        pool.shutdown()
        bundles.release()


def test_slice_all_flatten_gives_each_worker_its_dp_shard(echo_handle):
    mask = torch.zeros(6, 4, dtype=torch.long)
    for i in range(6):
        mask[i, : i % 4 + 1] = 1
    out = echo_handle.call(CounterRole.count, Batch({"prompts": mask, "prompt_mask": mask}))
    assert out["echo_tokens"].tolist() == [1, 2, 3, 4, 1, 2]  # rows back in order
    rows = echo_handle.call(CounterRole.tag_rows, list(range(6)))
    assert rows == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]  # contiguous shards, one per rank


def test_workers_build_from_the_plans_spec_and_the_drivers_objective(echo_handle):
    assert echo_handle.call(CounterRole.parts) == [(PLANNED_MICRO_BATCH, OBJECTIVE)] * WORKERS


def test_all_all_none_returns_one_result_per_worker(echo_handle):
    assert echo_handle.call(CounterRole.rank_of, "hi") == [(r, WORKERS, "hi") for r in range(WORKERS)]


def test_execute_first_runs_rank_zero_only(echo_handle):
    assert echo_handle.call(CounterRole.first) == [0]


def test_custom_dispatch_and_collect(echo_handle):
    # round-robin: worker i gets items i, i+2, ...; the custom collect sorts the union
    out = echo_handle.call(CounterRole.double, [1, 2, 3, 4, 5])
    assert out == [(2, 0), (4, 1), (6, 0), (8, 1), (10, 0)]


def test_undeclared_method_is_refused(echo_handle):
    with pytest.raises(AssertionError, match="not declared with @role_method"):
        echo_handle.call(CounterRole.__init__)


def test_flatten_keeps_one_output_per_dp_rank_in_dp_order():
    """TP=2 × DP=2: ranks 0,1 form DP group 0, ranks 2,3 group 1; only TP rank 0 returns output."""
    ranks = [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]
    spec = CallSpec(Dispatch.slice, Execute.all, Collect.flatten)
    shards = dispatch_shards(spec, [10, 11, 12, 13], ranks, [0, 1, 2, 3])
    assert shards == [[10, 11], [10, 11], [12, 13], [12, 13]]
    results = [["a"], ["dup"], ["b"], ["dup"]]
    assert collect_results(spec, results, ranks) == ["a", "b"]
    # results arrive in worker order, kept in DP order even when workers list DP ranks out of order
    swapped = [(1, 2, True), (0, 2, True)]
    assert collect_results(spec, [["late"], ["early"]], swapped) == ["early", "late"]
