"""teacher_logprob: the teacher's top-k next tokens on the student's responses (distillation)."""

from __future__ import annotations

from dagrl.backends.handles import train_role
from dagrl.config.schema import Algorithm
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives.distill import distill_topk


@register_node_kind("teacher_logprob")
class TeacherLogprobNode:
    """Runs the teacher forward on prompt + response; outputs [B, R, K] ids and log-probs over the
    whole vocabulary at algorithm.gkd.temperature (K = gkd_logits_topk, or the vocabulary size)."""

    required_inputs = ("prompts", "prompt_mask", "responses", "response_mask")
    optional_inputs = ()
    outputs = ("teacher_topk_ids", "teacher_topk_logprobs")
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        self.k = distill_topk(cfg)
        self.temperature = cfg.algorithm.gkd.temperature

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.algorithm.name == Algorithm.gkd

    def run(self, runtime, batch):
        out, _ = train_role(runtime, self.spec.role).teacher_topk(
            batch, k=self.k, temperature=self.temperature
        )
        return NodeResult(out, {})
