"""RLOO, REINFORCE++ and REINFORCE++-baseline against values worked out by hand in the comments."""

import pytest
import torch

from dagrl.algos.advantages import (
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_rloo_advantages,
    discounted_returns,
)


def test_rloo_leaves_each_response_out_of_its_baseline():
    # group 4: [1, 0, 0]: 1 - (0 + 0) / 2 = 1; 0 - (1 + 0) / 2 = -0.5 (twice)
    # group 7: [2, 4]: 2 - 4 = -2, 4 - 2 = 2; group 9 alone: its raw reward 0.5
    scores = torch.tensor([1.0, 0.0, 2.0, 0.0, 4.0, 0.5])
    groups = torch.tensor([4, 4, 7, 4, 7, 9])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0], [1, 0]])
    adv = compute_rloo_advantages(scores, groups, mask)
    expected = [[1.0, 1.0], [-0.5, 0.0], [-2.0, -2.0], [-0.5, -0.5], [0.0, 0.0], [0.5, 0.0]]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_discounted_returns_single_turn_and_kl_in_reward():
    # gamma 0.5, reward 1 on the last token: G = [0.25, 0.5, 1], padding 0
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    got = discounted_returns(rewards, torch.tensor([[1, 1, 1, 0]]), gamma=0.5)
    torch.testing.assert_close(got, torch.tensor([[0.25, 0.5, 1.0, 0.0]]))
    # gamma 1, KL penalty -0.1 on every token and score 1 at the end: [-0.1, -0.1, 0.9] summed
    # from each token on: [0.7, 0.8, 0.9]
    rewards = torch.tensor([[-0.1, -0.1, 0.9]])
    got = discounted_returns(rewards, torch.ones(1, 3), gamma=1.0)
    torch.testing.assert_close(got, torch.tensor([[0.7, 0.8, 0.9]]))


def test_discounted_returns_skip_observation_tokens():
    # multi-turn row: policy, observation, policy, policy; reward 2 at the end, gamma 0.5:
    # G3 = 2, G2 = 1, the observation passes 1 on undiscounted, G0 = 0.5 * 1 = 0.5
    # (verl's REINFORCE++ resets at the first masked token and would give G0 = 0)
    got = discounted_returns(torch.tensor([[0.0, 0.0, 0.0, 2.0]]), torch.tensor([[1, 0, 1, 1]]), gamma=0.5)
    torch.testing.assert_close(got, torch.tensor([[0.5, 0.0, 1.0, 2.0]]))


def test_reinforce_plus_plus_whitens_over_the_batch():
    # gamma 1: row 0 returns [1, 1]; row 1 [0, (masked, its reward 5 ignored)].
    # masked values 1, 1, 0: mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3, std 0.57735
    # -> (1/3) / 0.57735 = 0.57735 and (-2/3) / 0.57735 = -1.15470
    rewards = torch.tensor([[0.0, 1.0], [0.0, 5.0]])
    adv = compute_reinforce_plus_plus_advantages(rewards, torch.tensor([[1, 1], [1, 0]]), gamma=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.57735, 0.57735], [-1.15470, 0.0]]), atol=1e-5, rtol=0)


def test_reinforce_plus_plus_baseline():
    # group 0: [1, 0] -> mean 0.5 -> [0.5, -0.5]; group 3 alone keeps its 1.
    # on the tokens (row 0 has two): 0.5, 0.5, -0.5, 1 -> mean 0.375, deviations 0.125, 0.125,
    # -0.875, 0.625, squares sum 1.1875, unbiased var 1.1875 / 3 = 0.395833, std 0.629153
    # -> 0.125 / 0.629153 = 0.198680, -0.875 / 0.629153 = -1.390760, 0.625 / 0.629153 = 0.993399
    scores = torch.tensor([1.0, 0.0, 1.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0]])
    adv = compute_reinforce_plus_plus_baseline_advantages(scores, torch.tensor([0, 0, 3]), mask)
    expected = [[0.198680, 0.198680], [-1.390760, 0.0], [0.993399, 0.0]]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus_baseline"])
def test_group_estimators_refuse_one_sample(estimator):
    from dagrl.errors import ConfigError
    from dagrl.objectives import estimator as lookup
    from tests.conftest import compose_config

    cfg = compose_config(f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.n.*reinforce_plus_plus"):
        lookup(estimator).validate(cfg)
    lookup("reinforce_plus_plus").validate(cfg)  # no group needed


@pytest.mark.parametrize("n", [1, 8])
def test_reinforce_plus_plus_plans_without_groups(n):
    # its advantage node reads no group_ids (the DAG passes them: optional), KL in the reward
    # makes the reference's and the old log-probs required (by its own node, whose term the
    # advantage then requires)
    from dagrl.trainer.setup import prepare
    from tests.conftest import compose_config

    cfg = compose_config(
        "algorithm=reinforce_plus_plus", f"actor_rollout_ref.rollout.n={n}", "trainer.dry_run=true"
    )
    dag = prepare(cfg).dag
    node = dag.node("advantage")
    assert {"old_logprobs", "ref_logprobs"} <= set(dag.node("kl_in_reward").required_inputs)
    assert "kl_rewards" in node.required_inputs
    assert "group_ids" not in node.required_inputs


def test_gae_without_the_critic_dag_is_refused_naming_the_estimator():
    from dagrl.errors import ConfigError
    from dagrl.trainer.setup import prepare
    from tests.conftest import compose_config

    with pytest.raises(ConfigError, match="learns from a critic, and dag=grpo has none") as err:
        prepare(compose_config("algorithm.adv_estimator=gae", "trainer.dry_run=true"))
    assert err.value.key == "algorithm.adv_estimator"
