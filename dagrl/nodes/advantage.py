"""advantage: token rewards (score on the last token, optional KL-in-reward) and advantages from
the estimator of `algorithm.adv_estimator`, plus, with algorithm.distill_reward.coef, the
per-token reverse KL to a teacher as an advantage term (dagrl/algos/distillation.py
``reverse_kl_advantages``: on-policy distillation as a reward), and, with
actor_rollout_ref.rollout.multi_turn.turn_reward_mode=turn, the environment's per-turn rewards as
a reward-to-go term (``compute_turn_advantages``) × multi_turn.env_reward_weight, or, for an
estimator of discounted token returns (reinforce_plus_plus), inside its token rewards. With
reward.overlong_buffer.enable, DAPO's overlong penalty joins the scores first (training only:
validation reports the task reward)."""

from __future__ import annotations

import torch

from dagrl.algos import KLEstimator, kl_penalty, masked_mean
from dagrl.algos.advantages import compute_turn_advantages, place_turn_rewards
from dagrl.algos.dapo import overlong_penalty
from dagrl.algos.distillation import reverse_kl_advantages
from dagrl.config.schema import TurnRewardMode
from dagrl.config.validate_rollout import old_logprob_pass
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.errors import ConfigError
from dagrl.objectives import estimator

_KL_INPUTS = ("old_logprobs", "ref_logprobs")
_DISTILL_INPUTS = ("teacher_logprobs", "rollout_logprobs")
_TURN_INPUTS = ("turn_rewards", "turn_ids", "group_ids")


def turn_credit(cfg) -> bool:
    """Whether the environment's per-turn rewards reach the advantage turn by turn."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    return mt.enable and mt.turn_reward_mode == TurnRewardMode.turn


def distill_student_key(cfg) -> str:
    """The student's log-probs of its samples for the reverse-KL reward: the recomputed old ones,
    or the rollout's when the update skips that pass (validated on-policy)."""
    return "old_logprobs" if old_logprob_pass(cfg) else "rollout_logprobs"


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


@register_node_kind("advantage")
class AdvantageNode:
    # without a config: GRPO's; inputs_for asks the configured estimator
    required_inputs = ("scores", "group_ids", "response_mask")
    optional_inputs = (*_KL_INPUTS, *_DISTILL_INPUTS, "turn_rewards", "turn_ids", "values")
    outputs = ("token_rewards", "advantages", "returns")  # returns: a critic's targets (GAE, dag ppo)
    remote = False

    def __init__(self, spec, cfg):
        self.spec, self.algo = spec, cfg.algorithm
        self.overlong, self.max_response = cfg.reward.overlong_buffer, cfg.data.max_response_length
        self.estimator = estimator(cfg.algorithm.adv_estimator)
        self.student_key = distill_student_key(cfg)
        self.turn_weight = (
            cfg.actor_rollout_ref.rollout.multi_turn.env_reward_weight if turn_credit(cfg) else None
        )

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
        """(required, optional): the estimator's keys; the log-probs are required with KL in the reward."""
        required = ("scores", "response_mask", *estimator(cfg.algorithm.adv_estimator).required_keys)
        if cfg.algorithm.distill_reward.coef:
            required = (*required, "teacher_logprobs", distill_student_key(cfg))
        if cfg.algorithm.use_kl_in_reward:
            required = (*required, *_KL_INPUTS)
        if turn_credit(cfg):
            required = (*required, *_TURN_INPUTS)
        required = tuple(dict.fromkeys(required))
        # group_ids: the DAG passes it; an estimator without groups (reinforce_plus_plus) ignores it
        candidates = (*_KL_INPUTS, *_DISTILL_INPUTS, *_TURN_INPUTS, "group_ids", "values")
        optional = tuple(dict.fromkeys(k for k in candidates if k not in required))
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
        if self.algo.distill_reward.coef:
            student, teacher = batch[self.student_key], batch["teacher_logprobs"]
            advantages = advantages + reverse_kl_advantages(
                student, teacher, mask, self.algo.distill_reward.coef
            )
            metrics["distill/reverse_kl"] = float(masked_mean(student - teacher, mask))
        if self.turn_weight is not None and not self.estimator.token_level:
            # the environment's rewards, turn by turn (not in `scores`), beside the estimator's
            advantages, rewards = self._turn_credit(batch, mask, advantages, rewards, metrics)
        metrics["critic/advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["critic/advantages/max"] = float(advantages.max())
        return NodeResult(Batch({"token_rewards": rewards, "advantages": advantages, **extra}), metrics)

    def _token_rewards(self, batch, mask, metrics) -> torch.Tensor:
        """[B, R] what the estimator reads: the score (with DAPO's overlong penalty) on the last
        policy token, minus the per-token KL when it is in the reward, plus, for an estimator of
        token returns, each turn's reward on its turn's last policy token."""
        scores = batch["scores"].float()
        if self.overlong.enable:
            penalty = shaped_length_penalty(self.overlong, self.max_response, mask)
            scores = scores + penalty
            metrics["reward/overlong_penalty"] = float(penalty.mean())
            metrics["reward/overlong_rows"] = float((penalty < 0).float().mean())
        rewards = token_level_rewards(scores, mask)
        if self.algo.use_kl_in_reward:
            kl = kl_penalty(
                batch["old_logprobs"], batch["ref_logprobs"], KLEstimator.parse(self.algo.kl_penalty)
            )
            rewards = rewards - self.algo.kl_ctrl.kl_coef * kl * mask
            metrics["critic/kl_in_reward"] = float(masked_mean(kl, mask))
        if self.turn_weight is not None and self.estimator.token_level:
            # inside the returns: a turn's reward reaches its own tokens and, discounted by
            # algorithm.gamma, every earlier turn's
            placed = place_turn_rewards(batch["turn_rewards"], batch["turn_ids"], mask)
            rewards = rewards + self.turn_weight * placed
        return rewards

    def _turn_credit(self, batch, mask, advantages, rewards, metrics):
        """The per-turn term × env_reward_weight added to the advantages; each turn's reward placed
        on its last policy token of token_rewards (what a plugin reading them sees)."""
        turn_rewards, turn_ids = batch["turn_rewards"], batch["turn_ids"]
        per_turn = compute_turn_advantages(
            turn_rewards, turn_ids, mask, batch["group_ids"], norm_by_std=self.algo.norm_adv_by_std_in_grpo
        )
        metrics["critic/turn_advantages/mean"] = float(masked_mean(per_turn, mask))
        placed = place_turn_rewards(turn_rewards, turn_ids, mask)
        return advantages + self.turn_weight * per_turn, rewards + self.turn_weight * placed
