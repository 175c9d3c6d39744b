"""reward: rule rewards on the driver (decode, score, per-source means)."""

from __future__ import annotations

import numpy as np
import torch

from dagrl.config.schema import TurnRewardMode
from dagrl.console import log
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.rewards import mean_by_source
from dagrl.rewards.composer import NONFINITE_REWARDS, nonfinite_rows


def decode_responses(tokenizer, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """The masked tokens of each row as text: on multi-turn rows the policy's turns only (the
    reward functions judge what the policy said, observations left out)."""
    rows = [r[m.bool()].tolist() for r, m in zip(responses, response_mask)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def score_responses(runtime, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Scores [B] and reward metrics; shared by the reward node and validation.

    Non-finite scores are kept as they are, warned about (naming the rows) and counted in
    train/nonfinite_rewards: they make the advantages and the loss non-finite, so the update is
    skipped and counted as a skipped step (trainer.max_consecutive_skipped_steps stops the run).
    Zeroing them instead would train on a reward function's failure as if it were a score.
    """
    texts = decode_responses(runtime.tokenizer, batch["responses"], batch["response_mask"])
    sources, extras = list(batch["data_source"]), list(batch["extra_info"])
    trl = {}
    if runtime.rewarder.wants_prompts and "prompts" in batch:  # TRL-form rewards read prompts and ids
        trl["prompts"] = decode_responses(runtime.tokenizer, batch["prompts"], batch["prompt_mask"])
        trl["completion_ids"] = [
            r[m.bool()].tolist() for r, m in zip(batch["responses"], batch["response_mask"])
        ]
    scores, per_fn = runtime.rewarder.score_batch(sources, texts, list(batch["ground_truth"]), extras, **trl)
    bad = nonfinite_rows(scores, sources, extras)
    if bad:
        log(f"warning: non-finite reward for {bad}; the update on them is skipped")
    lengths = batch["response_mask"].sum(1).float()
    max_len = batch["responses"].shape[1]
    metrics = {
        "reward/mean": float(np.mean(scores)),
        "reward/std": float(np.std(scores)),
        "response_length/mean": float(lengths.mean()),
        "response_length/clip_ratio": float((lengths >= runtime.cfg.data.max_response_length).float().mean())
        if max_len >= runtime.cfg.data.max_response_length
        else 0.0,
    }
    metrics.update(mean_by_source(scores, sources))
    metrics[NONFINITE_REWARDS] = float(sum(not np.isfinite(s) for s in scores))
    for name, values in per_fn.items():
        if len(per_fn) > 1:
            metrics[f"reward/fn/{name}"] = float(np.nanmean(values))
    return torch.tensor(scores, dtype=torch.float32), metrics


@register_node_kind("reward")
class RewardNode:
    required_inputs = ("responses", "response_mask", "data_source", "ground_truth", "extra_info")
    # prompts: decoded for TRL-form rewards; env_rewards: a multi-turn environment's own rewards;
    # rm_scores: a reward model's (rm_score node), added by weight
    optional_inputs = ("prompts", "prompt_mask", "env_rewards", "rm_scores")
    outputs = ("scores",)
    remote = False

    def __init__(self, spec, cfg):
        self.spec, self.model = spec, cfg.reward.model
        mt = cfg.actor_rollout_ref.rollout.multi_turn
        self.env_weight = mt.env_reward_weight
        # turn_reward_mode=turn: the advantage node credits them turn by turn, not in the score
        self.env_in_score = mt.turn_reward_mode == TurnRewardMode.trajectory

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        scores, metrics = score_responses(runtime, batch)
        if "env_rewards" in batch:  # multi-turn: the environment's rewards join the functions' score
            total = scores + self.env_weight * batch["env_rewards"]
            scores = total if self.env_in_score else scores
            metrics["reward/env_mean"] = float(batch["env_rewards"].mean())
            metrics["reward/total_mean"] = float(total.mean())
        if "rm_scores" in batch.tensors:  # reward.model.*: rule rewards and the model's score, weighted
            metrics["reward/rule_mean"] = float(scores.mean())
            scores = self.model.rule_weight * scores + self.model.weight * batch["rm_scores"].float()
            metrics["reward/mean"] = float(scores.mean())
        return NodeResult(Batch({"scores": scores}), metrics)
