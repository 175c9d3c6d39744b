"""multi_turn.turn_reward_mode: the environment's per-turn rewards summed into the score
(trajectory) or reaching the advantage turn by turn (turn), through the reward and advantage
nodes of the multi-turn GRPO DAG."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dagrl.algos.advantages import compute_turn_advantages
from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.batch import Batch
from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled
from dagrl.errors import ConfigError
from dagrl.nodes.advantage import AdvantageNode
from dagrl.nodes.reward import RewardNode
from dagrl.nodes.reward_terms import TurnCreditNode
from tests.conftest import compose_config

MT = "actor_rollout_ref.rollout.multi_turn"
MULTI_TURN = [
    "dag=grpo_multi_turn",
    f"{MT}.enable=true",
    f"{MT}.tool_config_path=conf/tools/calculator.yaml",
    f"{MT}.max_tool_response_length=16",
    f"{MT}.max_assistant_turns=2",
    "data.max_response_length=64",
    "actor_rollout_ref.rollout.n=2",
]


def config(*overrides: str):
    cfg = compose_config(*MULTI_TURN, *overrides)
    resolve_defaults(cfg)
    validate(cfg)
    return cfg


def episodes() -> Batch:
    """Two episodes of one prompt: the first rewarded after its first turn, the second not."""
    return Batch(
        {
            "scores": torch.tensor([1.0, 0.0]),
            "group_ids": torch.tensor([0, 0]),
            "response_mask": torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]),
            "turn_ids": torch.tensor([[0, 0, 0, 1, -1], [0, 0, 0, 1, 1]]),
            "turn_rewards": torch.tensor([[0.5, 0.0], [0.0, 0.0]]),
            "env_rewards": torch.tensor([0.5, 0.0]),
        }
    )


def advantage_of(dag, cfg, batch: Batch) -> Batch:
    """The turn_credit node, then the advantage node summing its terms in, as the DAG runs them."""
    assert "turn_credit" in dag.deps["advantage"]
    terms = TurnCreditNode(dag.node("turn_credit"), cfg).run(None, batch).batch
    return AdvantageNode(dag.node("advantage"), cfg).run(None, batch.union(terms)).batch


def test_turn_mode_adds_the_turn_credit_to_the_score_advantage():
    cfg = config(f"{MT}.turn_reward_mode=turn", f"{MT}.env_reward_weight=2.0")
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout"})
    assert {"turn_rewards", "turn_ids"} <= set(dag.node("turn_credit").inputs)
    assert {"turn_token_rewards", "turn_advantages"} <= set(dag.node("advantage").inputs)
    batch = episodes()
    out = advantage_of(dag, cfg, batch)
    mask = batch["response_mask"].float()
    score_adv = torch.tensor([0.7071068, -0.7071068])[:, None] * mask  # GRPO on the scores alone
    turn_adv = compute_turn_advantages(batch["turn_rewards"], batch["turn_ids"], mask, batch["group_ids"])
    torch.testing.assert_close(out["advantages"], score_adv + 2.0 * turn_adv, atol=1e-5, rtol=0)
    # only the first episode's first turn was rewarded: its policy tokens gain over the others'
    assert out["advantages"][0, 0] > out["advantages"][0, 3]
    # token_rewards: the score on the last policy token, 2 x 0.5 on the first turn's last one
    assert out["token_rewards"][0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("mode, expected", [("trajectory", [2.0, 0.0]), ("turn", [1.0, 0.0])])
def test_reward_node_keeps_environment_rewards_out_of_the_score_in_turn_mode(mode, expected, monkeypatch):
    import dagrl.nodes.reward as reward

    cfg = config(f"{MT}.turn_reward_mode={mode}", f"{MT}.env_reward_weight=2.0")
    monkeypatch.setattr(reward, "score_responses", lambda runtime, batch: (torch.tensor([1.0, 0.0]), {}))
    result = RewardNode(SimpleNamespace(), cfg).run(SimpleNamespace(cfg=cfg), episodes())
    assert result.batch["scores"].tolist() == expected
    assert result.metrics["reward/total_mean"] == pytest.approx(1.0)  # 1 + 2 x 0.5 over 2 rows


def test_turn_mode_needs_grpo_advantages(monkeypatch):
    from dagrl.objectives import register_estimator
    from dagrl.registry import ESTIMATORS

    # the plugin estimator must not outlive this test (the registry lists every registered name)
    monkeypatch.setattr(ESTIMATORS, "_entries", dict(ESTIMATORS._entries))

    from dagrl.trainer.setup import prepare

    with pytest.raises(ConfigError) as e:  # the DAG's part of the rule: checked where the DAG is read
        prepare(
            compose_config(
                *MULTI_TURN,
                f"{MT}.turn_reward_mode=turn",
                "algorithm=gkd",
                "dag=gkd_multi_turn",
                "trainer.dry_run=true",
            )
        )
    assert e.value.key == f"{MT}.turn_reward_mode" and "computes no advantages" in str(e.value)
    with pytest.raises(ConfigError, match="group-normalised") as e:
        config(f"{MT}.turn_reward_mode=turn", "algorithm.adv_estimator=rloo")
    assert "(gae, reinforce_plus_plus)" in str(e.value)  # every estimator with a per-turn form
    register_estimator("plain_returns", required_keys=(), validate=lambda cfg: None)(
        lambda token_rewards, batch, algo: token_rewards
    )
    with pytest.raises(ConfigError, match="group-normalised") as e:
        config(f"{MT}.turn_reward_mode=turn", "algorithm.adv_estimator=plain_returns")
    assert e.value.key == f"{MT}.turn_reward_mode"


def test_turn_mode_puts_turn_rewards_into_reinforce_plus_plus_returns():
    cfg = config(
        f"{MT}.turn_reward_mode=turn",
        f"{MT}.env_reward_weight=2.0",
        "algorithm.adv_estimator=reinforce_plus_plus",
        "algorithm.gamma=0.5",
    )
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout"})
    out = advantage_of(dag, cfg, episodes())
    # token rewards: episode 0's score 1 on its last policy token (col 3), its first turn's 0.5 x 2
    # on that turn's last policy token (col 1); episode 1 earns nothing
    assert out["token_rewards"].tolist() == [[0.0, 1.0, 0.0, 1.0, 0.0], [0.0] * 5]
    # returns, gamma 0.5, the observation (col 2) passing them on: col 3: 1; col 1: 1 + 0.5 x 1
    # = 1.5; col 0: 0.5 x 1.5 = 0.75. Whitened with episode 1's four zeros: mean 3.25 / 7 =
    # 0.4642857, squared deviations 0.0816327 + 1.0727041 + 0.2869898 + 4 x 0.2155612 = 2.3035714,
    # unbiased var 2.3035714 / 6 = 0.3839286, std 0.6196197
    # -> 0.75: 0.461112, 1.5: 1.671532, 1: 0.864586, 0: -0.749308
    expected = [[0.461112, 1.671532, 0.0, 0.864586, 0.0], [-0.749308, -0.749308, 0.0, -0.749308, -0.749308]]
    torch.testing.assert_close(out["advantages"], torch.tensor(expected), atol=1e-5, rtol=0)
