"""teacher_logprob / teacher_hidden: what the teacher says about the student's responses (distillation).

Top-k distillation runs teacher_logprob (the teacher's top-k next tokens, [B, R, K]); full-vocabulary
distillation runs teacher_hidden (the teacher's final hidden states, [B, R, H']), from which the
train backend recomputes the teacher's logits chunk by chunk inside the loss: a [B, R, V] teacher
output per step is what runs out of memory at a 151,936-word vocabulary (docs/distillation.md).
"""

from __future__ import annotations

from dagrl.backends.handles import train_role
from dagrl.config.schema import Algorithm
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives.distill import distill_topk

_INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")


@register_node_kind("teacher_logprob")
class TeacherLogprobNode:
    """Runs the teacher forward on prompt + response; outputs [B, R, K] ids and log-probs over the
    whole vocabulary at algorithm.gkd.temperature (K = gkd_logits_topk)."""

    required_inputs = _INPUTS
    optional_inputs = ()
    outputs = ("teacher_topk_ids", "teacher_topk_logprobs")
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        self.k = distill_topk(cfg)
        self.temperature = cfg.algorithm.gkd.temperature

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.algorithm.name == Algorithm.gkd and cfg.algorithm.gkd.gkd_logits_topk is not None

    def run(self, runtime, batch):
        out, per_rank = train_role(runtime, self.spec.role).teacher_topk(
            batch, k=self.k, temperature=self.temperature
        )
        return NodeResult(out, reduce_all(per_rank))


@register_node_kind("teacher_hidden")
class TeacherHiddenNode:
    """Runs the teacher forward on prompt + response; outputs its final hidden states at the
    positions that predict each response token, [B, R, H'] (full-vocabulary distillation)."""

    required_inputs = _INPUTS
    optional_inputs = ()
    outputs = ("teacher_hidden",)
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.algorithm.name == Algorithm.gkd and cfg.algorithm.gkd.gkd_logits_topk is None

    def run(self, runtime, batch):
        out, per_rank = train_role(runtime, self.spec.role).teacher_hidden(batch)
        return NodeResult(out, reduce_all(per_rank))
