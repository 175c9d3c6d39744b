"""Does the job fit: the memory estimate against the device, the dataset against the batch size, and
GPU planning for a declared cluster in a dry run on a machine without GPUs."""

from __future__ import annotations

import pytest

from dagrl.config.placement import format_plan
from dagrl.errors import ConfigError
from dagrl.trainer.capacity import check_memory
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config

A = "actor_rollout_ref.actor"


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> str:
    """A 1.5B Qwen2 config.json (counted on the meta device, never loaded)."""
    from transformers import Qwen2Config

    path = tmp_path_factory.mktemp("model")
    Qwen2Config(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ).save_pretrained(path)
    return str(path)


def dry(*overrides: str):
    return prepare(compose_config("trainer.dry_run=true", *overrides))


def test_declared_gpu_cluster_is_planned_on_gpus_without_device_key():
    prepared = dry("trainer.nnodes=2", "trainer.n_gpus_per_node=4", "placement=separate")
    assert prepared.device == "cuda" and prepared.plan.device == "cuda"
    assert "cluster: 2 node(s) × 4 GPU(s), 8 used" in format_plan(prepared.plan)
    assert dry().plan.device == "cpu"  # the default job: one slot, no cluster declared
    assert dry("trainer.nnodes=2", "trainer.n_gpus_per_node=4", "trainer.device=cpu").plan.device == "cpu"


def test_dry_run_warns_and_run_refuses_when_memory_exceeds_the_device(big_model):
    overrides = (
        f"actor_rollout_ref.model.path={big_model}",
        f"{A}.optim.lr=1e-6",
        "trainer.n_gpus_per_node=2",
        f"{A}.optimizer_cpu_offload=false",  # pinned: auto would move the optimizer to the host
        "trainer.gpu_memory_gib=16",
    )
    prepared = dry(*overrides)
    plan = prepared.plan  # what the trainer keeps on the device between phases, and on the host
    train = plan.memory_gib["train"] + plan.offloaded_gib.get("train", 0.0)
    assert train > 16  # 1.5B × (fp32 weights, grads, Adam m and v) = ~23 GiB
    [warning] = prepared.warnings
    assert "in phase update" in warning and "16 GiB (trainer.gpu_memory_gib)" in warning
    for lever in ("bfloat16", "tensor_model_parallel_size", "offload", "distributed optimizer"):
        assert lever in warning
    prepared.cfg.trainer.dry_run = False  # the same plan in a real run: refused before Ray starts
    with pytest.raises(ConfigError) as info:
        check_memory(prepared.cfg, prepared.memory, prepared.plan)
    assert info.value.key == f"{A}.optimizer_cpu_offload" and "levers" in str(info.value)
    assert dry(*overrides[:-1], "trainer.gpu_memory_gib=80").warnings == ()


def test_auto_moves_the_optimizer_to_the_host_only_when_the_update_does_not_fit(big_model):
    """1.5B in fp32 on 17 GiB cards: with the optimizer on the device the update needs ~30 GiB; auto
    puts the fp32 state and the step on the host and the job fits (16.1 GiB, DDP's communicator on
    its two GPUs among it). On 80 GiB it stays on the device."""
    from dagrl.config.roles import Role
    from dagrl.trainer.memory_plan import format_memory_plan

    model = (f"actor_rollout_ref.model.path={big_model}", f"{A}.optim.lr=1e-6", "trainer.n_gpus_per_node=2")
    prepared = dry(*model, "trainer.gpu_memory_gib=17")
    assert prepared.warnings == ()
    assert prepared.cfg.actor_rollout_ref.actor.optimizer_cpu_offload is True
    assert prepared.plan.specs[Role.train].train.update.optimizer_cpu_offload is True  # what the worker reads
    assert f"{A}.optimizer_cpu_offload: auto -> true" in format_memory_plan(prepared.memory)
    assert prepared.plan.offloaded_gib["train"] > 16 * 1.5 / 1.07  # 16 bytes per parameter on the host
    assert dry(*model, "trainer.gpu_memory_gib=80").cfg.actor_rollout_ref.actor.optimizer_cpu_offload is False


def test_no_gpu_figure_assumes_80_gib_in_a_dry_run(big_model):
    prepared = dry(
        f"actor_rollout_ref.model.path={big_model}", f"{A}.optim.lr=1e-6", "trainer.n_gpus_per_node=2"
    )
    assert prepared.warnings == ()  # 23 GiB fits an 80 GiB card
    assert prepared.cfg.trainer.gpu_memory_gib is None


def test_batch_larger_than_dataset_fails_the_dry_run(tmp_path):
    with pytest.raises(ConfigError) as info:
        dry("data.train_batch_size=4096", f"{A}.ppo_mini_batch_size=4096")
    assert info.value.key == "data.train_batch_size"
    assert "2048 rows of data.builtin_train_rows" in str(info.value)

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dagrl.data.builtin import generate_rows

    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist(generate_rows("train", 10, 1)), train)
    pq.write_table(pa.Table.from_pylist(generate_rows("test", 4, 1)), val)
    with pytest.raises(ConfigError, match=r"larger than the 10 rows of data.train_files"):
        dry(f"data.train_files={train}", f"data.val_files={val}")


def test_host_memory_of_the_plan_is_checked_against_the_node(big_model):
    """1.5B fp32 on a 16 GiB card: auto puts the optimizer on the host (1.78B parameters: master,
    m and v, 12 bytes each, and two pinned buffers, the gradients and the fp32 staging copy, 6.6
    GiB each) and offloads the weights between turns (6.6 GiB more, pinned): 39.7 GiB. A 24 GiB node cannot
    hold it within 90 %: the dry run warns naming the node and the
    roles, a real run refuses under trainer.host_memory_gib; a 64 GiB node holds it."""
    from dagrl.trainer.capacity import check_host_memory
    from dagrl.trainer.memory_plan import format_memory_plan

    model = (
        f"actor_rollout_ref.model.path={big_model}",
        f"{A}.optim.lr=1e-6",
        "trainer.device=cuda",
        "trainer.gpu_memory_gib=16",
    )
    prepared = dry(*model, "trainer.host_memory_gib=24")
    [warning] = prepared.warnings
    assert (
        "GiB in host memory on node 0 (train 39.73)" in warning
        and "of its 24 GiB (trainer.host_memory_gib)" in warning
    )
    assert "host memory of node 0: 39.73 GiB = train 39.73" in format_memory_plan(prepared.memory)
    prepared.cfg.trainer.dry_run = False
    with pytest.raises(ConfigError) as info:
        check_host_memory(prepared.cfg, prepared.memory)
    assert info.value.key == "trainer.host_memory_gib" and "strategy=megatron" in str(info.value)
    assert dry(*model, "trainer.host_memory_gib=64").warnings == ()
    assert dry(*model).warnings == ()  # a dry run without the figure: not checked
