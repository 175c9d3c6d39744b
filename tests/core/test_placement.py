"""Placement: the plan on a declared cluster, and its realisation on a simulated 2-node Ray cluster."""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import remove_placement_group

from dagrl.config.placement import format_plan, make_plan
from dagrl.core.pools import WorkerPool, allocate
from dagrl.errors import PlacementError
from tests.conftest import compose_config

ROLES = {"train", "rollout", "ref"}


def plan_for(placement: str, device: str = "cuda", nnodes: int = 2, per_node: int = 2):
    cfg = compose_config(
        f"placement={placement}", f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}"
    )
    return cfg, make_plan(cfg, ROLES, device)


def test_colocate_plan_spans_both_nodes():
    _, plan = plan_for("colocate")
    assert len(plan.groups) == 1
    group = plan.groups[0]
    assert group.roles == ["train", "rollout", "ref"]
    assert group.slots == [0, 1, 2, 3]
    assert group.nodes(2) == {0: [0, 1], 1: [0, 1]}
    assert {r: layout.dp for r, layout in plan.roles.items()} == {"train": 4, "rollout": 4, "ref": 4}
    text = format_plan(plan)
    assert "2 node(s) × 2 GPU(s), 4 used" in text
    assert (
        "group 0 (colocated): roles ['train', 'rollout', 'ref'] on node 0: GPUs [0, 1], node 1: GPUs [0, 1]"
        in text
    )
    assert "train: 4 workers, DP=4 TP=1 PP=1 CP=1" in text


def test_separate_plan_gives_each_group_a_node():
    _, plan = plan_for("separate")
    assert [g.roles for g in plan.groups] == [["train", "ref"], ["rollout"]]
    assert plan.group_of("train").nodes(2) == {0: [0, 1]}
    assert plan.group_of("ref") is plan.group_of("train")
    assert plan.group_of("rollout").slots == [2, 3]
    assert plan.group_of("rollout").nodes(2) == {1: [0, 1]}
    assert plan.roles["train"].dp == 2 and plan.roles["rollout"].dp == 2
    text = format_plan(plan)
    assert "group 0 (colocated): roles ['train', 'ref'] on node 0: GPUs [0, 1]" in text
    assert "group 1 (separate): roles ['rollout'] on node 1: GPUs [0, 1]" in text


def test_cpu_plan_says_cpu_slots():
    _, plan = plan_for("colocate", device="cpu", nnodes=1, per_node=2)
    assert "1 node(s) × 2 CPU slot(s), 2 used" in format_plan(plan)


class Probe:
    """Stands in for dagrl.core.worker.Worker: same constructor, reports where Ray put it."""

    def __init__(self, cfg, roles, rank, world_size, device_kind, threads, build=None, cpu_affinity=None):
        self.roles, self.rank, self.world_size, self.device_kind = roles, rank, world_size, device_kind

    def node_info(self) -> dict:
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "rank": self.rank,
            "world_size": self.world_size,
            "roles": self.roles,
            "device_kind": self.device_kind,
        }

    def shutdown(self) -> None:
        pass


def pools_for(placement: str):
    cfg, plan = plan_for(placement)
    bundles = allocate(plan, timeout_s=60)
    pools = [WorkerPool(g, bundles, plan, cfg, actor_cls=Probe, setup=False) for g in plan.groups]
    return bundles, pools


def release(bundles, pools) -> None:
    for pool in pools:
        pool.shutdown()
    remove_placement_group(bundles.pg)


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head without GPUs and two worker nodes with 2 (fake) GPUs each, in this machine."""
    from ray.cluster_utils import Cluster

    ray.shutdown()  # a test before may have started the shared local Ray
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    try:
        workers = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        yield cluster, {w.node_id for w in workers}
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.own_ray  # a two-node cluster of its own
def test_colocated_pool_spans_two_ray_nodes(two_node_cluster):
    """One group over both nodes, ranks in node order. A group on each node (placement=separate)
    is test_device_and_cpu_groups_on_two_ray_nodes's: its device_groups are the separate plan's
    groups on swapped slots, plus a CPU group (the two forms give one plan:
    test_device_groups_give_the_same_plan_as_colocate_groups). Each pool started on the cluster
    costs a worker process per rank."""
    _, gpu_nodes = two_node_cluster
    start = time.perf_counter()

    bundles, pools = pools_for("colocate")
    try:
        (pool,) = pools
        infos = pool.node_info()
        assert [i["rank"] for i in infos] == [0, 1, 2, 3]
        nodes = [i["node_id"] for i in infos]
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes
        assert set(nodes) == gpu_nodes
        assert all(len(i["gpu_ids"]) == 1 for i in infos)
    finally:
        release(bundles, pools)

    assert time.perf_counter() - start < 60


@pytest.mark.own_ray  # a two-node cluster of its own
def test_allocate_more_slots_than_cluster(two_node_cluster):
    _, plan = plan_for("colocate", nnodes=3, per_node=2)
    with pytest.raises(PlacementError, match="the plan needs 6 GPU slots but the Ray cluster has 4 GPUs"):
        allocate(plan, timeout_s=10)


# ---- device_groups (ms-swift's form) -------------------------------------------------------------
SEPARATE_AS_GROUPS = (
    "+placement.device_groups={nproc_per_node: 2,"
    " actor: {device: GPU, ranks: 'list(range(0, 2))', workers: [train, ref]},"
    " sampler: {device: GPU, ranks: [2, 3], workers: [rollout]}}"
)


def test_device_groups_give_the_same_plan_as_colocate_groups():
    _, separate = plan_for("separate")
    cfg = compose_config("trainer.nnodes=2", "trainer.n_gpus_per_node=2", SEPARATE_AS_GROUPS)
    grouped = make_plan(cfg, ROLES, "cuda")
    assert format_plan(grouped) == format_plan(separate)
    assert [(g.roles, g.slots) for g in grouped.groups] == [(["train", "ref"], [0, 1]), (["rollout"], [2, 3])]


def test_device_groups_as_a_json_string_with_counts():
    groups = {
        "nproc_per_node": 2,
        "all": {"device": "GPU", "ranks": 4, "workers": ["train", "rollout", "ref"]},
    }
    import json

    _, colocate = plan_for("colocate")
    cfg = compose_config("trainer.nnodes=2", "trainer.n_gpus_per_node=2")
    cfg.placement.device_groups = json.dumps(groups)  # what placement.device_groups='<json>' gives
    assert format_plan(make_plan(cfg, ROLES, "cuda")) == format_plan(colocate)


def test_cpu_group_runs_a_role_without_gpus():
    cfg = compose_config(
        "trainer.n_gpus_per_node=2",
        "+roles.judge=rules",
        "+placement.device_groups={nproc_per_node: 2,"
        " gpu: {device: GPU, ranks: 2, workers: [train, rollout, ref]},"
        " judge: {device: CPU, ranks: 3, workers: [judge]}}",
    )
    plan = make_plan(cfg, ROLES | {"judge"}, "cuda")
    judge = plan.group_of("judge")
    assert judge.device == "cpu" and len(judge.slots) == 3 and plan.roles["judge"].dp == 3
    assert plan.device_slots == 2 and plan.total_slots == 5
    assert "judge: 3 workers" in format_plan(plan) and "3 CPU worker(s)" in format_plan(plan)


@pytest.mark.parametrize(
    "groups, key",
    [
        (
            "{nproc_per_node: 4, a: {ranks: 2, workers: [train, rollout, ref]}}",
            "placement.device_groups.nproc_per_node",
        ),
        ("{a: {device: TPU, ranks: 2, workers: [train]}}", "placement.device_groups.a.device"),
        (
            "{a: {ranks: [0, 1], workers: [train, ref]}, b: {ranks: [1], workers: [rollout]}}",
            "placement.device_groups.b.ranks",
        ),
        ("{a: {ranks: [0, 9], workers: [train]}}", "placement.device_groups.a.ranks"),
        ("{a: {ranks: 'range(0, 2)', workers: [train]}}", "placement.device_groups.a.ranks"),
        (
            "{a: {ranks: 1, workers: [train]}, b: {ranks: 1, workers: [train]}}",
            "placement.device_groups.b.workers",
        ),
    ],
)
def test_device_groups_errors_name_the_key(groups, key):
    from dagrl.errors import ConfigError

    cfg = compose_config("trainer.n_gpus_per_node=2", f"+placement.device_groups={groups}")
    with pytest.raises(ConfigError) as exc:
        make_plan(cfg, {"train"}, "cuda")
    assert exc.value.key == key


def test_device_groups_must_place_every_role():
    cfg = compose_config(
        "trainer.n_gpus_per_node=2", "+placement.device_groups={a: {ranks: 2, workers: [train]}}"
    )
    with pytest.raises(PlacementError, match="rollout"):
        make_plan(cfg, {"train", "rollout"}, "cuda")


@pytest.mark.own_ray  # a two-node cluster of its own
def test_device_and_cpu_groups_on_two_ray_nodes(two_node_cluster):
    _, gpu_nodes = two_node_cluster
    cfg = compose_config(
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",
        "+roles.judge=rules",
        "+placement.device_groups={nproc_per_node: 2,"
        " actor: {device: GPU, ranks: [2, 3], workers: [train, ref]},"
        " sampler: {device: GPU, ranks: [0, 1], workers: [rollout]},"
        " judge: {device: CPU, ranks: 2, workers: [judge]}}",
    )
    plan = make_plan(cfg, ROLES | {"judge"}, "cuda")
    bundles = allocate(plan, timeout_s=60)
    pools = [WorkerPool(g, bundles, plan, cfg, actor_cls=Probe, setup=False) for g in plan.groups]
    try:
        by_roles = {tuple(p.roles): p.node_info() for p in pools}
        train, rollout, judge = by_roles[("train", "ref")], by_roles[("rollout",)], by_roles[("judge",)]
        # ranks 2,3 are node 1's devices, ranks 0,1 node 0's: each GPU group fills one node
        assert [i["roles"] for i in train] == [["train", "ref"]] * 2
        assert [i["rank"] for i in train] == [0, 1] and train[0]["world_size"] == 2
        assert len({i["node_id"] for i in train}) == 1 and len({i["node_id"] for i in rollout}) == 1
        assert {i["node_id"] for i in train} != {i["node_id"] for i in rollout}
        assert {i["node_id"] for i in train + rollout} == gpu_nodes
        for infos in (train, rollout):  # one GPU per actor, distinct within the node
            assert sorted(g for i in infos for g in i["gpu_ids"]) == ["0", "1"]
        assert [i["gpu_ids"] for i in judge] == [[], []] and [i["rank"] for i in judge] == [0, 1]
        assert [i["device_kind"] for i in judge] == ["cpu", "cpu"]
    finally:
        release(bundles, pools)


def test_plan_names_each_role_engine_and_backend():
    cfg = compose_config(
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.strategy=megatron",
        "trainer.n_gpus_per_node=2",
    )
    text = format_plan(make_plan(cfg, ROLES, "cuda"))
    assert "rollout: 2 workers, DP=2 TP=1 PP=1 CP=1, rollout engine vllm" in text
    assert "train: 2 workers, DP=2 TP=1 PP=1 CP=1, train backend megatron" in text
    assert ", train backend megatron (forward only)" in text  # ref
    text = format_plan(make_plan(compose_config(), ROLES, "cpu"))
    assert "rollout engine hf" in text and "train backend torch" in text


def test_describe_placement_names_each_ranks_node_and_card():
    """The line a run prints per pool (the two-node acceptance reads it to check where roles went)."""
    from dagrl.core.pools import describe_placement

    infos = [
        {"node_id": "a1b2c3d4e5f6", "ip": "10.0.0.1", "gpu_ids": ["0"]},
        {"node_id": "ffee00112233", "ip": "10.0.0.2", "gpu_ids": []},
    ]
    line = describe_placement(["train", "ref"], infos)
    assert (
        line
        == "placed train,ref: rank 0 node a1b2c3d4 (10.0.0.1) GPU 0; rank 1 node ffee0011 (10.0.0.2) GPU -"
    )
