"""advantage: token rewards (score on the last token) and advantages from the estimator of
`algorithm.adv_estimator`, with the optional terms their own nodes computed summed in
(dagrl/nodes/reward_terms.py): the KL-in-reward and each turn's reward as token rewards, the
distillation reward and the turn credit as advantage terms. For an estimator of discounted token
returns (reinforce_plus_plus) each turn's reward goes inside its token rewards. With
reward.overlong_buffer.enable, DAPO's overlong penalty joins the scores first (training only:
validation reports the task reward)."""

from __future__ import annotations

import torch

from dagrl.algos import masked_mean
from dagrl.algos.dapo import overlong_penalty
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.errors import ConfigError
from dagrl.nodes.reward_terms import turn_credit
from dagrl.objectives import estimator

# the optional terms (dagrl/nodes/reward_terms.py) and the config key that enables each
_TERMS = ("kl_rewards", "distill_advantages", "turn_token_rewards", "turn_advantages")


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] scores placed on each row's last response token -> [B, R]. The last masked column, not
    the mask's count: multi-turn rows have observations (mask 0) between the policy's turns."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    columns = torch.arange(response_mask.shape[1])
    last = torch.where(response_mask.bool(), columns, -1).max(dim=1).values.clamp(min=0)
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards * response_mask


def shaped_length_penalty(overlong, max_response_length: int, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] DAPO's overlong penalty of each row (reward.overlong_buffer), on the policy's tokens
    (a multi-turn row's observations do not count)."""
    lengths = response_mask.sum(1)
    return overlong_penalty(lengths, max_response_length, overlong.len, overlong.penalty_factor)


def enabled_terms(cfg) -> tuple[str, ...]:
    """The optional terms this config asks for: the advantage node requires each of them, so a DAG
    without the node making it is refused when it is built."""
    on = {
        "kl_rewards": cfg.algorithm.use_kl_in_reward,
        "distill_advantages": cfg.algorithm.distill_reward.coef != 0,
        "turn_token_rewards": turn_credit(cfg),
        "turn_advantages": turn_credit(cfg),
    }
    return tuple(k for k in _TERMS if on[k])


@register_node_kind("advantage")
class AdvantageNode:
    # without a config: GRPO's; inputs_for asks the configured estimator
    required_inputs = ("scores", "group_ids", "response_mask")
    optional_inputs = (*_TERMS, "values")
    outputs = ("token_rewards", "advantages", "returns")  # returns: a critic's targets (GAE, dag ppo)
    remote = False

    def __init__(self, spec, cfg):
        self.spec, self.algo = spec, cfg.algorithm
        self.overlong, self.max_response = cfg.reward.overlong_buffer, cfg.data.max_response_length
        self.estimator = estimator(cfg.algorithm.adv_estimator)

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    @staticmethod
    def check_config(cfg, spec) -> None:
        """The configured estimator's rules (GRPO's groups need rollout.n >= 2), and a critic's
        targets made exactly when the DAG trains a critic on them."""
        name = cfg.algorithm.adv_estimator
        entry = estimator(name)
        entry.validate(cfg)
        if entry.critic_targets and "returns" not in spec.outputs:
            raise ConfigError(
                "algorithm.adv_estimator",
                name,
                f"{name} learns from a critic, and dag={cfg.dag} has none (no values / critic_update"
                " nodes): use algorithm=ppo (dag=ppo), or an estimator without a critic"
                " (grpo, rloo, reinforce_plus_plus)",
            )
        if "returns" in spec.outputs and not entry.critic_targets:
            raise ConfigError(
                "dag",
                cfg.dag,
                f"this DAG trains a critic on GAE's returns, which algorithm.adv_estimator={name}"
                " does not make: use algorithm.adv_estimator=gae (algorithm=ppo), or dag=grpo",
            )

    @staticmethod
    def inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(required, optional): the estimator's keys and the optional terms the config asks for."""
        required = ("scores", "response_mask", *estimator(cfg.algorithm.adv_estimator).required_keys)
        required = tuple(dict.fromkeys((*required, *enabled_terms(cfg))))
        # group_ids: the DAG passes it; an estimator without groups (reinforce_plus_plus) ignores it
        optional = tuple(k for k in (*_TERMS, "group_ids", "values") if k not in required)
        return required, optional

    def run(self, runtime, batch):
        mask = batch["response_mask"].float()
        metrics: dict[str, float] = {}
        rewards = self._token_rewards(batch, mask, metrics)
        advantages = self.estimator.estimate(rewards, batch, self.algo)
        extra = {}
        if self.estimator.critic_targets:  # GAE: the critic's targets beside the advantages
            advantages, extra["returns"] = advantages
            metrics["critic/returns/mean"] = float(masked_mean(extra["returns"], mask))
            metrics["critic/values/mean"] = float(masked_mean(batch["values"].float(), mask))
        if "distill_advantages" in batch:
            advantages = advantages + batch["distill_advantages"]
        if "turn_advantages" in batch and not self.estimator.token_level:
            # the environment's rewards, turn by turn (not in `scores`), beside the estimator's;
            # placed on each turn's last policy token of token_rewards (what a plugin reading them sees)
            advantages = advantages + batch["turn_advantages"]
            rewards = rewards + batch["turn_token_rewards"]
        metrics["critic/advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["critic/advantages/max"] = float(advantages.max())
        return NodeResult(Batch({"token_rewards": rewards, "advantages": advantages, **extra}), metrics)

    def _token_rewards(self, batch, mask, metrics) -> torch.Tensor:
        """[B, R] what the estimator reads: the score (with DAPO's overlong penalty) on the last
        policy token, plus the KL-in-reward term, plus, for an estimator of token returns, each
        turn's reward on its turn's last policy token."""
        scores = batch["scores"].float()
        if self.overlong.enable:
            penalty = shaped_length_penalty(self.overlong, self.max_response, mask)
            scores = scores + penalty
            metrics["reward/overlong_penalty"] = float(penalty.mean())
            metrics["reward/overlong_rows"] = float((penalty < 0).float().mean())
        rewards = token_level_rewards(scores, mask)
        if "kl_rewards" in batch:
            rewards = rewards + batch["kl_rewards"]
        if "turn_token_rewards" in batch and self.estimator.token_level:
            # inside the returns: a turn's reward reaches its own tokens and, discounted by
            # algorithm.gamma, every earlier turn's
            rewards = rewards + batch["turn_token_rewards"]
        return rewards
