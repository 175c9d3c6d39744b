"""actor_update: PPO/GRPO epochs on the train pool."""

from __future__ import annotations

from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind


@register_node_kind("actor_update")
class ActorUpdateNode:
    required_inputs = ("prompts", "prompt_mask", "responses", "response_mask", "advantages")
    # old_logprobs: absent when the update is on-policy and recompute_old_logprobs=false;
    # rollout_logprobs: the rollout-vs-trainer mismatch metrics and rollout_correction
    optional_inputs = ("old_logprobs", "ref_logprobs", "rollout_logprobs")
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        _, per_rank = runtime.role(self.spec.role).run("train_step", batch)
        metrics = reduce_all(per_rank)
        return NodeResult(Batch(), metrics)
