"""advantage: token rewards (score on the last token, optional KL-in-reward) and advantages from
the estimator of `algorithm.adv_estimator`."""

from __future__ import annotations

import torch

from dagrl.algos import KLEstimator, kl_penalty, masked_mean
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives import estimator

_KL_INPUTS = ("old_logprobs", "ref_logprobs")


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] scores placed on each row's last response token -> [B, R]."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards * response_mask


@register_node_kind("advantage")
class AdvantageNode:
    # without a config: GRPO's; inputs_for asks the configured estimator
    required_inputs = ("scores", "group_ids", "response_mask")
    optional_inputs = _KL_INPUTS
    outputs = ("token_rewards", "advantages")
    remote = False

    def __init__(self, spec, cfg):
        self.spec, self.algo = spec, cfg.algorithm
        self.estimator = estimator(cfg.algorithm.adv_estimator)

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    @staticmethod
    def inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(required, optional): the estimator's keys; the log-probs are required with KL in the reward."""
        required = ("scores", "response_mask", *estimator(cfg.algorithm.adv_estimator).required_keys)
        if cfg.algorithm.use_kl_in_reward:
            return (*required, *_KL_INPUTS), ()
        return required, _KL_INPUTS

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
        advantages = self.estimator.estimate(rewards, batch, self.algo)
        metrics["critic/advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["critic/advantages/max"] = float(advantages.max())
        return NodeResult(Batch({"token_rewards": rewards, "advantages": advantages}), metrics)
