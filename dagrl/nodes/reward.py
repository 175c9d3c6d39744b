"""reward: rule rewards on the driver (decode, score, per-source means)."""

from __future__ import annotations

import numpy as np
import torch

from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.rewards import mean_by_source


def decode_responses(tokenizer, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    rows = [r[m.bool()].tolist() for r, m in zip(responses, response_mask)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def score_responses(runtime, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Scores [B] and reward metrics; shared by the reward node and validation."""
    texts = decode_responses(runtime.tokenizer, batch["responses"], batch["response_mask"])
    sources = list(batch["data_source"])
    trl = {}
    if runtime.rewarder.wants_prompts and "prompts" in batch:  # TRL-form rewards read prompts and ids
        trl["prompts"] = decode_responses(runtime.tokenizer, batch["prompts"], batch["prompt_mask"])
        trl["completion_ids"] = [
            r[m.bool()].tolist() for r, m in zip(batch["responses"], batch["response_mask"])
        ]
    scores, per_fn = runtime.rewarder.score_batch(
        sources, texts, list(batch["ground_truth"]), list(batch["extra_info"]), **trl
    )
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
    for name, values in per_fn.items():
        if len(per_fn) > 1:
            metrics[f"reward/fn/{name}"] = float(np.nanmean(values))
    return torch.tensor(scores, dtype=torch.float32), metrics


@register_node_kind("reward")
class RewardNode:
    required_inputs = ("responses", "response_mask", "data_source", "ground_truth", "extra_info")
    optional_inputs = ("prompts", "prompt_mask")  # decoded for TRL-form rewards
    outputs = ("scores",)
    remote = False

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        scores, metrics = score_responses(runtime, batch)
        return NodeResult(Batch({"scores": scores}), metrics)
