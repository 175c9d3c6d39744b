"""The sampling pipeline's pure parts: step ends, filters, PRM aggregation, the shard files, and
the ms-swift device_groups form planning sampler / prm / orm on their own ranks."""

from __future__ import annotations

import json

import pytest
import torch

from dagrl.config.sample_schema import PrmAggregate, SampleConfig, SampleFilter
from dagrl.errors import ConfigError
from dagrl.rewards.steps import step_end_tokens
from dagrl.sample.filter import kept_indices
from tests.conftest import compose_config


def test_step_ends_at_each_separator_and_the_last_token():
    assert step_end_tokens(["a", "\n", "\nb", "c"], "\n\n") == [2, 3]
    assert step_end_tokens(["x", "\n\n"], "\n\n") == [1]  # a separator at the end: one step
    assert step_end_tokens(["12", "<|end|>"], "\n\n") == [1]
    assert step_end_tokens([], "\n\n") == []


def test_filters():
    scores = [0.1, 0.9, 0.5, 0.9, 0.2, 0.3, 0.8, 0.0]  # two prompts, n=4
    best = SampleConfig(filter=SampleFilter.best_of_n, n_best_to_keep=1)
    assert kept_indices(scores, 4, best) == [1, 6]  # ties keep the earlier sample
    best.n_best_to_keep = 2
    assert kept_indices(scores, 4, best) == [1, 3, 5, 6]
    assert kept_indices(scores, 4, SampleConfig(filter=SampleFilter.threshold, threshold=0.5)) == [1, 2, 3, 6]
    assert kept_indices(scores, 4, SampleConfig(filter=SampleFilter.keep_all)) == list(range(8))


def test_prm_aggregates_over_valid_steps_only():
    from dagrl.nodes.reward_model import aggregate_steps

    steps = torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    assert aggregate_steps(steps, valid, PrmAggregate.min).tolist() == [-1.0, 3.0, 0.0]
    assert aggregate_steps(steps, valid, PrmAggregate.last).tolist() == [2.0, 3.0, 0.0]
    assert aggregate_steps(steps, valid, PrmAggregate.mean).tolist() == [0.5, 3.0, 0.0]


def test_a_restart_with_other_settings_is_refused(tmp_path):
    from dagrl.sample.runner import job_identity, open_job

    cfg = compose_config("pipeline=sample")
    open_job(str(tmp_path), job_identity(cfg, 16))
    open_job(str(tmp_path), job_identity(cfg, 16))  # the same job continues
    cfg.sample.shard_size = 3
    with pytest.raises(ConfigError, match="sample.output_dir.*shard_size"):
        open_job(str(tmp_path), job_identity(cfg, 16))
    assert json.loads((tmp_path / "sample_state.json").read_text())["shard_size"] == 64


def test_shard_is_written_whole_or_not_at_all(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dagrl.sample.runner import write_shard

    path = str(tmp_path / "shard_00000.parquet")
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        write_shard([{"a": 1}, {"a": "not an int"}], path)  # fails while writing
    assert not (tmp_path / "shard_00000.parquet").exists()
    write_shard([{"a": 1}, {"a": 2}], path)
    assert pq.read_table(path).column("a").to_pylist() == [1, 2]


SWIFT_GROUPS = (
    "placement.device_groups={nproc_per_node: 4, sample_group: {device: GPU, ranks: 'list(range(0, 2))',"
    " workers: [sampler]}, rm_group: {device: GPU, ranks: 'list(range(2, 4))', workers: [prm, orm]}}"
)


def test_ms_swift_device_groups_plan_sampler_and_reward_models(tmp_path):
    """The ms-swift sampling layout: sampler on ranks 0-1, prm + orm sharing ranks 2-3."""
    from dagrl.data.builtin import tiny_reward_model_path
    from dagrl.trainer.setup import prepare

    rm = tiny_reward_model_path()
    cfg = compose_config(
        "pipeline=sample",
        SWIFT_GROUPS,
        f"sample.orm_model={rm}",
        f"sample.prm_model={rm}",
        "trainer.n_gpus_per_node=4",
        "trainer.dry_run=true",
    )
    plan = prepare(cfg).plan
    groups = {tuple(sorted(g.roles)): g for g in plan.groups}
    assert set(groups) == {("sampler",), ("orm", "prm")}
    assert plan.roles["sampler"].dp == 2 and plan.roles["prm"].dp == 2 and plan.roles["orm"].dp == 2
    assert plan.roles["prm"].group == plan.roles["orm"].group != plan.roles["sampler"].group


def test_a_sampling_job_takes_any_batch_size(tmp_path):
    """Nothing trains in pipeline=sample: the actor's mini-batch follows data.train_batch_size, so
    a job over 8 prompts with data.train_batch_size=8 (what the dataset-size rule asks for) is
    planned rather than refused for the actor's default mini-batch of 16."""
    from dagrl.data import write_parquet
    from dagrl.data.builtin import generate_rows
    from dagrl.trainer.setup import prepare

    train = tmp_path / "train.parquet"
    write_parquet(generate_rows("train", 8, 0), str(train))
    for size in (8, 4, 3):
        cfg = compose_config(
            "pipeline=sample",
            f"data.train_files={train}",
            f"data.train_batch_size={size}",
            "trainer.dry_run=true",
        )
        assert "sampler" in prepare(cfg).plan.roles
        assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == size
