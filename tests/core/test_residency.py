"""Data stays where it is used: outputs read on the producer's workers never reach the driver.

A plugin role on two real Ray workers produces [B, P, 64] "hidden states" (a colocated teacher's
stand-in) and a second node on the same workers reads them: the driver never receives them (driver
bytes stay below their size), each DP rank reads its own rows, a driver node that asks for them
fetches them, and the workers' stores are empty after the step, also after a failed one. A second
role on the same workers with one DP rank (`tp1`: both workers run, rank 0 returns) reads them in
another DP layout: they go from worker to worker through Ray's object store, re-split to the
reader's ranks, and the driver passes only the refs."""

from __future__ import annotations

import textwrap

import pytest
import torch

import tests.plugins.hidden_role  # noqa: F401  (registers the hid role's backend in the driver)
from dagrl.backends import build_backend
from dagrl.config.placement import make_plan
from dagrl.core.batch import Batch, Held
from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled
from dagrl.core.failures import RunFailure
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.core.pools import RoleHandle, WorkerPool, allocate
from dagrl.core.residency import Keep, WorkerStore, plan_inputs, plan_residency
from dagrl.core.runtime import Runtime
from dagrl.core.scheduler import Scheduler
from tests.conftest import compose_config, start_local_ray
from tests.plugins.hidden_role import (
    HiddenRole,
    count_object_fetches,
    hidden_of,
    object_fetches,
    stored_entries,
)

ROWS, WIDTH = 8, 16
HIDDEN_BYTES = ROWS * WIDTH * 64 * 4


class _Remote:
    optional_inputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True


@register_node_kind("restest_hidden")
class HiddenNode(_Remote):
    required_inputs = ("prompts",)
    outputs = ("teacher_hidden",)

    def run(self, runtime, batch):
        out, _ = runtime.role(self.spec.role).call(HiddenRole.hidden, batch)
        return NodeResult(out)


@register_node_kind("restest_consume")
class ConsumeNode(_Remote):
    required_inputs = ("prompts", "teacher_hidden")
    outputs = ("scores",)

    def run(self, runtime, batch):
        out, per_rank = runtime.role(self.spec.role).call(HiddenRole.consume, batch)
        return NodeResult(out, {"right_rows": min(m["right_rows"] for m in per_rank)})


@register_node_kind("restest_peek")
class PeekNode:
    """A driver node that may read the hidden states (an optional input) and here does."""

    required_inputs = ("prompts",)
    optional_inputs = ("teacher_hidden",)
    outputs = ("token_rewards",)
    remote = False

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        right = torch.equal(batch["teacher_hidden"], hidden_of(batch["prompts"]))
        return NodeResult(Batch({"token_rewards": batch["prompts"].float()}), {"peek_right": float(right)})


@register_node_kind("restest_hidden_tp1")
class HiddenTp1Node(HiddenNode):
    def run(self, runtime, batch):
        out, _ = runtime.role("tp1").call(HiddenRole.hidden, batch)
        return NodeResult(out)


@register_node_kind("restest_consume_tp1")
class ConsumeTp1Node(ConsumeNode):
    def run(self, runtime, batch):
        out, per_rank = runtime.role("tp1").call(HiddenRole.consume, batch)
        return NodeResult(out, {"right_rows": min(m["right_rows"] for m in per_rank)})


@register_node_kind("restest_consume_tp1_again")
class ConsumeTp1AgainNode(_Remote):
    """A second reader of the hidden states on the tp1 role (as a teacher and the update both
    read a handed-over column on one pool)."""

    required_inputs = ("prompts", "teacher_hidden")
    outputs = ("token_rewards",)

    def run(self, runtime, batch):
        out, per_rank = runtime.role("tp1").call(HiddenRole.consume, batch)
        rewards = Batch({"token_rewards": out["scores"]})
        return NodeResult(rewards, {"right_rows_again": min(m["right_rows"] for m in per_rank)})


@register_node_kind("restest_fail")
class FailNode(_Remote):
    required_inputs = ("teacher_hidden",)
    outputs = ()

    def run(self, runtime, batch):
        raise RuntimeError("restest node failed on purpose")


@pytest.fixture(scope="module")
def hid_pool():
    # the session's Ray, started as every test starts it: in a full run this module and
    # test_calls.py are the first to need Ray, and a Ray either started itself would serve the rest
    # of the session without the spare preloaded worker (tests/spare_workers.py)
    start_local_ray()
    cfg = compose_config(
        "external_plugins=[tests.plugins.hidden_role]",
        "+roles.hid=hidden",
        "+roles.tp1=hidden_tp",
        "trainer.n_gpus_per_node=2",
        "placement.colocate_groups=[[hid,tp1]]",
    )
    plan = make_plan(cfg, {"hid", "tp1"}, "cpu")
    bundles = allocate(plan, timeout_s=60)
    pool = WorkerPool(plan.groups[0], bundles, plan, cfg, build=build_backend)
    try:
        yield cfg, pool
    finally:
        pool.shutdown()
        bundles.release()


def scheduler_for(tmp_path, cfg, pool, nodes: str) -> Scheduler:
    path = tmp_path / "dag.yaml"
    path.write_text("source: [prompts]\n" + textwrap.dedent(nodes))
    source, specs = load_dag_specs(str(path))
    dag = build_dag(str(path), source, prune_disabled(specs, cfg), roles_with_pool={"hid", "tp1"})
    roles = {"hid": RoleHandle("hid", pool), "tp1": RoleHandle("tp1", pool)}
    return Scheduler(dag, Runtime(cfg=cfg, roles=roles))


def prompts_batch() -> Batch:
    return Batch({"prompts": torch.arange(ROWS * WIDTH).reshape(ROWS, WIDTH)})


def entries(pool) -> list[int]:
    return pool.get([a.run.remote(stored_entries) for a in pool.actors])


PRODUCE_CONSUME = """
nodes:
  teacher:
    kind: restest_hidden
    role: hid
    inputs: [prompts]
    outputs: [teacher_hidden]
  update:
    kind: restest_consume
    role: hid
    inputs: [prompts, teacher_hidden]
    outputs: [scores]
"""


def test_hidden_states_stay_on_the_workers(tmp_path, hid_pool):
    cfg, pool = hid_pool
    scheduler = scheduler_for(tmp_path, cfg, pool, PRODUCE_CONSUME)
    try:
        out, metrics = scheduler.run(prompts_batch(), step=1)
    finally:
        scheduler.close()
    # each DP rank read its own rows (a swapped piece would not be its prompts' hidden states)
    assert metrics["right_rows"] == 1.0
    assert torch.equal(out["scores"], hidden_of(prompts_batch()["prompts"]).sum((1, 2)))
    # they never crossed: the driver sent the prompts once (the producer's workers stored them for
    # the consumer on the same workers: residency.plan_inputs) and got the scores back, nothing more
    prompts_bytes = ROWS * WIDTH * 8
    assert metrics["perf/kept_bytes"] == HIDDEN_BYTES
    assert metrics["perf/driver_bytes"] == prompts_bytes + ROWS * 4 < HIDDEN_BYTES
    assert "teacher_hidden" not in out  # freed with the step
    assert entries(pool) == [0, 0]


def test_driver_reader_fetches_and_a_failed_step_frees(tmp_path, hid_pool):
    cfg, pool = hid_pool
    peek = scheduler_for(
        tmp_path,
        cfg,
        pool,
        PRODUCE_CONSUME
        + """
  peek:
    kind: restest_peek
    inputs: [prompts, teacher_hidden]
    outputs: [token_rewards]
""",
    )
    try:
        _, metrics = peek.run(prompts_batch(), step=1)
    finally:
        peek.close()
    assert metrics["peek_right"] == 1.0 and metrics["right_rows"] == 1.0
    assert metrics["perf/driver_bytes"] >= HIDDEN_BYTES  # fetched once, for the driver node that read it
    failing = scheduler_for(
        tmp_path,
        cfg,
        pool,
        """
        nodes:
          teacher:
            kind: restest_hidden
            role: hid
            inputs: [prompts]
            outputs: [teacher_hidden]
          boom:
            kind: restest_fail
            role: hid
            inputs: [teacher_hidden]
        """,
    )
    try:
        # one line naming the node (dagrl/core/failures.py), the error it carries
        with pytest.raises(RunFailure, match="DAG node boom .*RuntimeError: restest node failed on purpose"):
            failing.run(prompts_batch(), step=2)
    finally:
        failing.close()
    assert entries(pool) == [0, 0]


def test_plan_keeps_what_the_default_dags_read_on_the_same_workers():
    """Colocated GRPO: the log-probs stay, the rollout's responses go to the reward and stay too;
    GKD with a colocated teacher: the hidden states stay; KL in the reward makes the driver's
    advantage node need the log-probs (mirrored)."""

    class Handle:
        def __init__(self, pool, ranks):
            self.pool, self.ranks = pool, ranks

    def plan(*overrides):
        cfg = compose_config(*overrides)
        source, specs = load_dag_specs(cfg.dag)
        dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout", "ref", "teacher"})
        same = Handle("pool", [(0, 1, True)])
        roles = {r: same for r in ("train", "rollout", "ref", "teacher")}
        return plan_residency(dag, roles, {s.name for s in dag.nodes})

    grpo = plan("actor_rollout_ref.actor.recompute_old_logprobs=true")  # auto skips it on-policy
    assert grpo["old_logprob"] == ({"old_logprobs"}, set(), set())
    sampled = {"responses", "response_mask"}
    assert grpo["rollout"] == ({"rollout_logprobs", *sampled}, sampled, set())
    assert plan("algorithm=gkd")["teacher_hidden"] == ({"teacher_hidden"}, set(), set())
    assert "old_logprob" not in plan()  # on-policy by default: the update's own log-probs
    kl = plan("algorithm.use_kl_in_reward=true")
    assert kl["old_logprob"] == ({"old_logprobs"},) * 2 + (set(),)
    assert kl["ref_logprob"] == ({"ref_logprobs"},) * 2 + (set(),)


def test_the_data_is_stored_by_the_first_of_its_readers_in_one_place():
    """Colocated GRPO: the rollout stores the prompts for the update on the same workers; with the
    rollout on a pool of its own, the train pool's first reader stores them (the update waits for
    it), and a key read in one place once is sent as before."""

    class Handle:
        def __init__(self, pool):
            self.pool, self.ranks = pool, [(0, 1, True)]

    cfg = compose_config("actor_rollout_ref.actor.recompute_old_logprobs=true")
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout"})
    names = {s.name for s in dag.nodes}
    same = Handle("pool")
    assert plan_inputs(dag, {"train": same, "rollout": same}, names) == {
        "rollout": {"prompts", "prompt_mask"}
    }
    apart = {"train": Handle("train pool"), "rollout": Handle("rollout pool")}
    assert plan_inputs(dag, apart, names) == {"old_logprob": {"prompts", "prompt_mask"}}
    assert plan_inputs(dag, apart, names - {"actor_update"}) == {}


def test_worker_store_keeps_the_first_of_two_calls_and_refuses_a_dropped_run():
    """A node calling twice (chunks) keeps its first output only (the second comes back as values);
    entries of a run that ended (or failed) are refused, so nothing outlives its step."""
    store, keep = WorkerStore(), Keep("7.1", stay=frozenset({"old_logprobs"}))
    first = store.keep((Batch({"old_logprobs": torch.ones(2, 3)}), {}), keep, dp_rank=1, dp_size=2)
    assert first[0].held["old_logprobs"].part == 1 and first[0].held["old_logprobs"].value is None
    second = store.keep(Batch({"old_logprobs": torch.zeros(2, 3)}), keep, dp_rank=1, dp_size=2)
    assert "old_logprobs" in second.tensors and torch.equal(
        store.get("7.1", "old_logprobs"), torch.ones(2, 3)
    )
    assert torch.equal(store.resolve(Batch(held=first[0].held), dp_rank=1)["old_logprobs"], torch.ones(2, 3))
    assert store.drop("7.1") == 1 and not store.entries
    late = store.keep(Batch({"old_logprobs": torch.ones(2, 3)}), keep, dp_rank=1, dp_size=2)
    assert "old_logprobs" in late.tensors and not store.entries


@pytest.mark.parametrize(
    "producer, consumer",
    [("restest_hidden_tp1", "restest_consume"), ("restest_hidden", "restest_consume_tp1")],
)
def test_handed_over_between_dp_layouts_through_the_object_store(tmp_path, hid_pool, producer, consumer):
    """DP 1 -> DP 2 and DP 2 -> DP 1 on the same two workers: each consumer rank reads exactly its
    rows (its prompts' hidden states) from the object store, the driver never gets them; and the
    prompts, in runs of 2 equal rows (collate's n samples), travel as their distinct rows."""
    cfg, pool = hid_pool
    scheduler = scheduler_for(
        tmp_path,
        cfg,
        pool,
        f"""
        nodes:
          teacher:
            kind: {producer}
            role: {"tp1" if producer.endswith("tp1") else "hid"}
            inputs: [prompts]
            outputs: [teacher_hidden]
          update:
            kind: {consumer}
            role: {"tp1" if consumer.endswith("tp1") else "hid"}
            inputs: [prompts, teacher_hidden]
            outputs: [scores]
        """,
    )
    prompts = Batch({"prompts": torch.arange(ROWS // 2 * WIDTH).reshape(ROWS // 2, WIDTH)}).repeat_interleave(
        2
    )
    try:
        out, metrics = scheduler.run(prompts, step=1)
    finally:
        scheduler.close()
    assert metrics["right_rows"] == 1.0
    assert torch.equal(out["scores"], hidden_of(prompts["prompts"]).sum((1, 2)))
    # the prompts went to each node as their 4 distinct rows (two layouts: no store), the scores
    # came back (from both workers where both run one DP rank: the driver reads rank 0's)
    scores = ROWS * 4 * (2 if consumer.endswith("tp1") else 1)
    assert metrics["perf/driver_bytes"] == 2 * (ROWS // 2) * WIDTH * 8 + scores
    assert metrics["perf/handed_bytes"] == HIDDEN_BYTES and metrics["perf/kept_bytes"] == 0
    assert entries(pool) == [0, 0]


def test_two_readers_of_a_handed_over_column_on_one_worker_fetch_it_once(tmp_path, hid_pool):
    """DP 2 -> two nodes on a DP-1 role of the same workers: each worker gets the two producer
    ranks' objects from the object store once for both nodes, and holds none after the step."""
    cfg, pool = hid_pool
    scheduler = scheduler_for(
        tmp_path,
        cfg,
        pool,
        """
        nodes:
          teacher:
            kind: restest_hidden
            role: hid
            inputs: [prompts]
            outputs: [teacher_hidden]
          update:
            kind: restest_consume_tp1
            role: tp1
            inputs: [prompts, teacher_hidden]
            outputs: [scores]
          again:
            kind: restest_consume_tp1_again
            role: tp1
            inputs: [prompts, teacher_hidden]
            outputs: [token_rewards]
            after: [update]
        """,
    )
    pool.get([a.run.remote(count_object_fetches) for a in pool.actors])
    try:
        out, metrics = scheduler.run(prompts_batch(), step=1)
    finally:
        scheduler.close()
        fetches = pool.get([a.run.remote(object_fetches) for a in pool.actors])
    assert metrics["right_rows"] == metrics["right_rows_again"] == 1.0
    assert torch.equal(out["token_rewards"], out["scores"])
    assert fetches == [(2, 0), (2, 0)]  # (objects got, objects still held): two, once, freed
    assert metrics["perf/handed_bytes"] == HIDDEN_BYTES


def test_handed_over_pieces_cut_for_any_dp_size():
    """12 rows put by 3 producer ranks (4 each), read by 2 ranks (6 each) or by 4 (3 each)."""
    refs = (("r0", 0, 4), ("r1", 0, 4), ("r2", 0, 4))
    column = Held("1.1", "teacher_hidden", rows=12, dp_size=3, nbytes=1200, refs=refs)
    two = column.pieces(2)
    assert [p.refs for p in two] == [(("r0", 0, 4), ("r1", 0, 2)), (("r1", 2, 4), ("r2", 0, 4))]
    assert [(p.part, p.rows, p.nbytes) for p in two] == [(0, 6, 600), (1, 6, 600)]
    four = [p.refs for p in column.pieces(4)]
    assert four == [
        (("r0", 0, 3),),
        (("r0", 3, 4), ("r1", 0, 2)),
        (("r1", 2, 4), ("r2", 0, 1)),
        (("r2", 1, 4),),
    ]
    with pytest.raises(AssertionError):  # kept in the producer's stores only: its own DP size
        Held("1.1", "teacher_hidden", rows=12, dp_size=3).pieces(2)


def test_plan_hands_the_rollout_over_to_a_separate_train_pool():
    """placement=separate: the rollout's log-probs go to the update through the object store only,
    the responses there too and to the driver for the reward; nothing stays on the rollout pool."""

    class Handle:
        def __init__(self, pool):
            self.pool, self.ranks = pool, [(0, 1, True)]

    cfg = compose_config()
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout"})
    roles = {"train": Handle("train pool"), "rollout": Handle("rollout pool")}
    sampled = {"responses", "response_mask"}
    plan = plan_residency(dag, roles, {s.name for s in dag.nodes})
    assert plan == {"rollout": (set(), sampled, {"rollout_logprobs", *sampled})}
