"""The optional terms of a GRPO/PPO step's rewards and advantages, one node kind each, wired in
the DAG YAMLs between the passes they read and the advantage node that sums them in:

- ``kl_in_reward`` (algorithm.use_kl_in_reward): the per-token KL penalty to the reference,
  −kl_ctrl.kl_coef × KL(old ‖ ref) on each policy token (``kl_rewards``, a token-reward term);
- ``distill_reward`` (algorithm.distill_reward.coef ≠ 0): on-policy distillation as a reward, the
  per-token reverse KL to a teacher as an advantage term (``distill_advantages``,
  dagrl/algos/distillation.py ``reverse_kl_advantages``);
- ``turn_credit`` (actor_rollout_ref.rollout.multi_turn.turn_reward_mode=turn): the environment's
  per-turn rewards × multi_turn.env_reward_weight, placed on each turn's last policy token
  (``turn_token_rewards``) and, for a group-normalised estimator, as a reward-to-go advantage term
  (``turn_advantages``, ``compute_turn_advantages``).

Each is enabled by the config key that asks for it, so a DAG carries the node and a config without
the key runs the DAG without it; the advantage node reads what ran.
"""

from __future__ import annotations

import torch

from dagrl.algos import KLEstimator, kl_penalty, masked_mean
from dagrl.algos.advantages import compute_turn_advantages, place_turn_rewards
from dagrl.algos.distillation import reverse_kl_advantages
from dagrl.config.schema import TurnRewardMode
from dagrl.config.validate_rollout import old_logprob_pass
from dagrl.core.batch import Batch, declare_key
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives import estimator

declare_key("kl_rewards", "[B, R] −kl_coef × KL(old ‖ ref) per policy token (algorithm.use_kl_in_reward)")
declare_key("distill_advantages", "[B, R] −coef × (student − teacher) log-prob per token (distill_reward)")
declare_key("turn_token_rewards", "[B, R] multi-turn: each turn's reward × weight on its last policy token")
declare_key("turn_advantages", "[B, R] multi-turn: group-normalised reward-to-go of the turns × weight")

_STUDENT_KEYS = ("old_logprobs", "rollout_logprobs")


def turn_credit(cfg) -> bool:
    """Whether the environment's per-turn rewards reach the advantage turn by turn."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    return mt.enable and mt.turn_reward_mode == TurnRewardMode.turn


def distill_student_key(cfg) -> str:
    """The student's log-probs of its samples for the reverse-KL reward: the recomputed old ones,
    or the rollout's when the update skips that pass (validated on-policy)."""
    return "old_logprobs" if old_logprob_pass(cfg) else "rollout_logprobs"


@register_node_kind("kl_in_reward")
class KlInRewardNode:
    required_inputs = ("old_logprobs", "ref_logprobs", "response_mask")
    optional_inputs = ()
    outputs = ("kl_rewards",)
    remote = False

    def __init__(self, spec, cfg):
        self.coef = cfg.algorithm.kl_ctrl.kl_coef
        self.estimator = KLEstimator.parse(cfg.algorithm.kl_penalty)

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.algorithm.use_kl_in_reward

    def run(self, runtime, batch):
        mask = batch["response_mask"].float()
        kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], self.estimator)
        metrics = {"critic/kl_in_reward": float(masked_mean(kl, mask))}
        return NodeResult(Batch({"kl_rewards": -self.coef * kl * mask}), metrics)


@register_node_kind("distill_reward")
class DistillRewardNode:
    required_inputs = ("teacher_logprobs", "response_mask")
    optional_inputs = _STUDENT_KEYS  # inputs_for: the one this config's student log-probs are in
    outputs = ("distill_advantages",)
    remote = False

    def __init__(self, spec, cfg):
        self.coef = cfg.algorithm.distill_reward.coef
        self.student_key = distill_student_key(cfg)

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.algorithm.distill_reward.coef != 0

    @staticmethod
    def inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
        student = distill_student_key(cfg)
        return ("teacher_logprobs", student, "response_mask"), tuple(k for k in _STUDENT_KEYS if k != student)

    def run(self, runtime, batch):
        mask = batch["response_mask"].float()
        student, teacher = batch[self.student_key], batch["teacher_logprobs"]
        term = reverse_kl_advantages(student, teacher, mask, self.coef)
        metrics = {"distill/reverse_kl": float(masked_mean(student - teacher, mask))}
        return NodeResult(Batch({"distill_advantages": term}), metrics)


@register_node_kind("turn_credit")
class TurnCreditNode:
    required_inputs = ("turn_rewards", "turn_ids", "group_ids", "response_mask")
    optional_inputs = ()
    outputs = ("turn_token_rewards", "turn_advantages")
    remote = False

    def __init__(self, spec, cfg):
        self.weight = cfg.actor_rollout_ref.rollout.multi_turn.env_reward_weight
        self.norm_by_std = cfg.algorithm.norm_adv_by_std_in_grpo
        # an estimator of discounted token returns takes the turn rewards inside its returns
        # (the advantage node adds turn_token_rewards before it): no separate advantage term
        self.in_returns = estimator(cfg.algorithm.adv_estimator).token_level

    @staticmethod
    def enabled(cfg) -> bool:
        return turn_credit(cfg)

    def run(self, runtime, batch):
        mask = batch["response_mask"].float()
        turn_rewards, turn_ids = batch["turn_rewards"], batch["turn_ids"]
        placed = self.weight * place_turn_rewards(turn_rewards, turn_ids, mask)
        if self.in_returns:
            return NodeResult(
                Batch({"turn_token_rewards": placed, "turn_advantages": torch.zeros_like(placed)})
            )
        per_turn = compute_turn_advantages(
            turn_rewards, turn_ids, mask, batch["group_ids"], norm_by_std=self.norm_by_std
        )
        metrics = {"critic/turn_advantages/mean": float(masked_mean(per_turn, mask))}
        out = Batch({"turn_token_rewards": placed, "turn_advantages": self.weight * per_turn})
        return NodeResult(out, metrics)
