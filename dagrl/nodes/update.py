"""actor_update: PPO/GRPO epochs on the train pool."""

from __future__ import annotations

import numpy as np

from dagrl.backends.handles import train_role
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind


@register_node_kind("actor_update")
class ActorUpdateNode:
    required_inputs = ("prompts", "prompt_mask", "responses", "response_mask", "old_logprobs", "advantages")
    optional_inputs = ("ref_logprobs",)
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        _, per_rank = train_role(runtime, self.spec.role).train_step(batch)
        metrics = {k: float(np.mean([m[k] for m in per_rank])) for k in per_rank[0]}
        return NodeResult(Batch(), metrics)
