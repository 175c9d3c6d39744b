"""Dynamic sampling's pieces (dagrl/trainer/dynamic_sampling.py) without workers: which nodes a
round re-runs, joining rounds' rows, merging their metrics, and the rules refused before Ray."""

from __future__ import annotations

import pytest
import torch

from dagrl.core.batch import Batch
from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled
from dagrl.errors import ConfigError
from dagrl.trainer.dynamic_sampling import concat_rows, merge_rounds, sampling_nodes
from tests.conftest import compose_config


def _dag(*overrides):
    cfg = compose_config("algorithm=dapo", *overrides)
    source, specs = load_dag_specs(cfg.dag)
    return build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout", "ref", "rm"})


def test_a_round_reruns_the_reward_and_what_it_needs():
    assert sampling_nodes(_dag()) == {"weight_sync", "rollout", "reward"}
    # a reward model's score feeds the reward: it is sampled again with each round
    with_rm = _dag("reward.model.enable=true", "reward.model.path=/x")
    assert sampling_nodes(with_rm) == {"weight_sync", "rollout", "rm", "reward"}


def test_rounds_join_with_prompts_left_padded_to_the_longest():
    # round 1's prompts are 2 wide, round 2's 3: round 1's get one pad (id 0, mask 0) on the left
    one = Batch(
        {
            "prompts": torch.tensor([[5, 6]]),
            "prompt_mask": torch.tensor([[1, 1]]),
            "responses": torch.tensor([[7, 8]]),
        },
        {"ground_truth": ["a"]},
    )
    two = Batch(
        {
            "prompts": torch.tensor([[4, 5, 6]]),
            "prompt_mask": torch.tensor([[1, 1, 1]]),
            "responses": torch.tensor([[9, 9]]),
        },
        {"ground_truth": ["b"]},
    )
    empty = one.index([])  # a round that kept nothing
    joined = concat_rows([one, empty, two], pad_id=0)
    assert joined["prompts"].tolist() == [[0, 5, 6], [4, 5, 6]]
    assert joined["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert joined["responses"].tolist() == [[7, 8], [9, 9]]
    assert joined["ground_truth"] == ["a", "b"]


def test_round_metrics_sum_seconds_and_bytes_and_average_the_rest():
    merged = merge_rounds(
        [
            {"timing_s/rollout": 1.0, "reward/mean": 0.2, "perf/driver_bytes": 10.0},
            {"timing_s/rollout": 2.0, "reward/mean": 0.4, "perf/driver_bytes": 5.0},
            {"timing_s/actor_update": 3.0, "perf/driver_bytes": 1.0},
        ]
    )
    assert merged == pytest.approx(
        {"timing_s/rollout": 3.0, "reward/mean": 0.3, "perf/driver_bytes": 16.0, "timing_s/actor_update": 3.0}
    )


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
        (
            ["placement=separate", "actor_rollout_ref.rollout.overlap_steps=1"],
            "algorithm.filter_groups.enable",
        ),
        (
            ["algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"],
            "algorithm.filter_groups.metric",
        ),
        (["reward.overlong_buffer.len=8"], "reward.overlong_buffer.len"),
        (
            ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
            "actor_rollout_ref.actor.loss_agg_mode",
        ),
    ],
)
def test_dapo_refuses_before_ray(overrides, key):
    from dagrl.trainer.setup import prepare

    cfg = compose_config("algorithm=dapo", "trainer.dry_run=true", *overrides)
    with pytest.raises(ConfigError) as err:
        prepare(cfg)
    assert err.value.key == key


def test_filter_groups_needs_an_advantage_node():
    from dagrl.trainer.setup import prepare

    cfg = compose_config("algorithm=gkd", "algorithm.filter_groups.enable=true", "trainer.dry_run=true")
    with pytest.raises(ConfigError, match="no reward and advantage nodes"):
        prepare(cfg)


def test_overlong_buffer_len_defaults_to_a_fifth_of_the_limit():
    from dagrl.config.validate import resolve_defaults

    cfg = compose_config("algorithm=dapo", "data.max_response_length=20480")
    resolve_defaults(cfg)
    assert cfg.reward.overlong_buffer.len == 4096


def test_overlong_penalty_reaches_the_advantages_in_training():
    from dagrl.config.validate import resolve_defaults
    from dagrl.nodes.advantage import AdvantageNode

    # limit 8, buffer 2 (expected 6), factor 1: two correct answers of 8 and 4 tokens score
    # 1 - 1 = 0 and 1 - 0 = 1; GRPO on [0, 1]: [-0.7071, +0.7071]
    cfg = compose_config("algorithm=dapo", "data.max_response_length=8", "reward.overlong_buffer.len=2")
    resolve_defaults(cfg)
    mask = torch.tensor([[1] * 8, [1] * 4 + [0] * 4])
    batch = Batch(
        {"scores": torch.tensor([1.0, 1.0]), "group_ids": torch.tensor([0, 0]), "response_mask": mask}
    )
    dag = _dag()
    out = AdvantageNode(dag.node("advantage"), cfg).run(None, batch)
    torch.testing.assert_close(
        out.batch["advantages"], torch.tensor([-0.7071068, 0.7071068])[:, None] * mask, atol=1e-5, rtol=0
    )
    assert out.metrics["reward/overlong_penalty"] == pytest.approx(-0.5)
