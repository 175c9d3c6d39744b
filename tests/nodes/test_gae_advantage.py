"""The advantage node of the PPO DAG: GAE on the critic's values gives the advantages and the
critic's returns (hand-computed below), with the score on each row's last policy token."""

from __future__ import annotations

import pytest
import torch

from dagrl.config.validate import resolve_defaults
from dagrl.core.batch import Batch
from dagrl.core.dag import load_dag_specs, prune_disabled
from dagrl.nodes.advantage import AdvantageNode
from dagrl.nodes.reward_terms import TurnCreditNode
from tests.conftest import compose_config


def test_gae_node_returns_the_critic_targets():
    cfg = compose_config("algorithm=ppo", "algorithm.lam=0.5")
    resolve_defaults(cfg)
    _, specs = load_dag_specs(cfg.dag)
    [spec] = [s for s in prune_disabled(specs, cfg) if s.kind == "advantage"]
    batch = Batch(
        {
            "scores": torch.tensor([1.0, 0.0]),
            "group_ids": torch.tensor([0, 0]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
            "values": torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]]),
        }
    )
    out = AdvantageNode(spec, cfg).run(None, batch)
    # row 0: rewards [0, 0, 1], γ = 1, λ = 0.5: A = [0.225, 0.25, 0.3] (tests/algos/test_value.py),
    # returns = A + V = [0.725, 0.85, 1.0]. Row 1 ends at token 1 with reward 0 (value 9 masked):
    # t=1: δ = 0 - 0.4, A = -0.4; t=0: δ = 0.4 - 0.2 = 0.2, A = 0.2 + 0.5 × -0.4 = 0; returns [0.2, 0]
    expected = torch.tensor([[0.725, 0.85, 1.0], [0.2, 0.0, 0.0]])
    torch.testing.assert_close(out.batch["returns"], expected)
    assert out.metrics["critic/returns/mean"] == pytest.approx(2.775 / 5)
    assert set(out.batch.keys()) == {"token_rewards", "advantages", "returns"}


def test_gae_credits_each_turn_of_an_episode():
    """turn_reward_mode=turn with GAE (a token-level estimator): each turn's reward sits on its last
    policy token and, γ = λ = 1 with zero values, every token's return is its reward-to-go."""
    mt = "actor_rollout_ref.rollout.multi_turn"
    cfg = compose_config(
        "algorithm=ppo",
        "dag=ppo_multi_turn",
        f"{mt}.enable=true",
        f"{mt}.tool_config_path=conf/tools/calculator.yaml",
        f"{mt}.turn_reward_mode=turn",
        f"{mt}.env_reward_weight=2.0",
    )
    resolve_defaults(cfg)
    _, specs = load_dag_specs(cfg.dag)
    pruned = {s.kind: s for s in prune_disabled(specs, cfg)}
    spec = pruned["advantage"]
    assert {"turn_rewards", "turn_ids"} <= set(pruned["turn_credit"].inputs)
    assert {"turn_token_rewards", "values"} <= set(spec.inputs)
    batch = Batch(
        {  # one episode: turn 0 (tokens 0-1, reward 0.5), an observation (token 2), turn 1 (token 3)
            "scores": torch.tensor([1.0]),
            "group_ids": torch.tensor([0]),
            "response_mask": torch.tensor([[1, 1, 0, 1]]),
            "turn_ids": torch.tensor([[0, 0, 0, 1]]),
            "turn_rewards": torch.tensor([[0.5, 0.0]]),
            "values": torch.zeros(1, 4),
        }
    )
    terms = TurnCreditNode(pruned["turn_credit"], cfg).run(None, batch).batch
    out = AdvantageNode(spec, cfg).run(None, batch.union(terms)).batch
    # token rewards [0, 2 × 0.5, 0, 1]: returns [2, 2, 0 (observation), 1]
    torch.testing.assert_close(out["returns"], torch.tensor([[2.0, 2.0, 0.0, 1.0]]))
