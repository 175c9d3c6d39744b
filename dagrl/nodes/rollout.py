"""rollout: one sampled response per row on the rollout pool."""

from __future__ import annotations

import numpy as np

from dagrl.core.node import NodeResult, register_node_kind


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of a step: the same step of a resumed run samples the same responses."""
    return (seed * 1_000_003 + step) % (2**31)


@register_node_kind("rollout")
class RolloutNode:
    required_inputs = ("prompts", "prompt_mask")
    optional_inputs = ()
    outputs = ("responses", "response_mask", "rollout_logprobs")
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        handle = runtime.role(self.spec.role)
        out, per_rank = handle.run("generate", batch, seed=step_seed(runtime.cfg.trainer.seed, runtime.step))
        metrics = {k: float(np.mean([m[k] for m in per_rank if k in m])) for k in set().union(*per_rank)}
        metrics["rollout/tokens_per_s"] = sum(m["rollout/tokens_per_s"] for m in per_rank)  # all replicas
        return NodeResult(out, metrics)
