"""advantage: token rewards (score on the last token, optional KL-in-reward) and GRPO advantages."""

from __future__ import annotations

import torch

from dagrl.algos import KLEstimator, compute_grpo_advantages, kl_penalty, masked_mean
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] scores placed on each row's last response token -> [B, R]."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards * response_mask


@register_node_kind("advantage")
class AdvantageNode:
    required_inputs = ("scores", "group_ids", "response_mask")
    optional_inputs = ("old_logprobs", "ref_logprobs")
    outputs = ("token_rewards", "advantages")
    remote = False

    def __init__(self, spec, cfg):
        self.spec, self.algo = spec, cfg.algorithm

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        mask = batch["response_mask"].float()
        rewards = token_level_rewards(batch["scores"], mask)
        metrics = {}
        if self.algo.use_kl_in_reward:
            kl = kl_penalty(
                batch["old_logprobs"], batch["ref_logprobs"], KLEstimator.parse(self.algo.kl_penalty)
            )
            rewards = rewards - self.algo.kl_ctrl.kl_coef * kl * mask
            metrics["critic/kl_in_reward"] = float(masked_mean(kl, mask))
        advantages = compute_grpo_advantages(
            rewards.sum(1), batch["group_ids"], mask, norm_by_std=self.algo.norm_adv_by_std_in_grpo
        )
        metrics["critic/advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["critic/advantages/max"] = float(advantages.max())
        return NodeResult(Batch({"token_rewards": rewards, "advantages": advantages}), metrics)
