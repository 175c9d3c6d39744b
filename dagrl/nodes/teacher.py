"""teacher_logprob: the teacher's view of the student's responses (distillation).

Outputs what its DAG declares of:
- teacher_topk_ids / teacher_topk_logprobs [B, R, K]: the teacher's top-k next tokens at every
  response position, log-probs over the whole vocabulary at algorithm.gkd.temperature (GKD, OPSD);
- teacher_logprobs [B, R]: the teacher's log-probs of the sampled tokens at the rollout
  temperature (on-policy distillation as a reward, algorithm.distill_reward).

OPSD: with `teacher_prompts` among its inputs, the teacher reads each row's privileged prompt
followed by the *same* response token ids (never re-tokenised text). Prompts are left-padded and
responses right-padded, so response token r is predicted at column P' − 1 + r of every row, as
after the student's prompt: the teacher's outputs land on the student's [B, R] response grid and
the loss compares them token by token under `response_mask`. The swap happens here, before the
backend is called, so every train backend serves OPSD through its plain teacher calls. Rows
without a privileged prompt carry their own prompt there (collate), i.e. plain GKD.
"""

from __future__ import annotations

from dagrl.backends.handles import train_role
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives.distill import DISTILL_ALGORITHMS, distill_topk

_TOPK = ("teacher_topk_ids", "teacher_topk_logprobs")


def with_teacher_prompts(batch: Batch) -> Batch:
    """The batch the teacher scores: its privileged prompts in place of the student's, when given."""
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    if "teacher_prompts" not in batch:
        return batch.select(keys)
    return Batch(
        {
            "prompts": batch["teacher_prompts"],
            "prompt_mask": batch["teacher_prompt_mask"],
            "responses": batch["responses"],
            "response_mask": batch["response_mask"],
        }
    )


@register_node_kind("teacher_logprob")
class TeacherLogprobNode:
    required_inputs = ("prompts", "prompt_mask", "responses", "response_mask")
    optional_inputs = ("teacher_prompts", "teacher_prompt_mask")
    outputs = (*_TOPK, "teacher_logprobs")
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        self.k = distill_topk(cfg) if set(_TOPK) & set(spec.outputs) else None
        self.temperature = cfg.algorithm.gkd.temperature

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.algorithm.name in DISTILL_ALGORITHMS or cfg.algorithm.distill_reward.coef != 0

    def run(self, runtime, batch):
        role = train_role(runtime, self.spec.role)
        view = with_teacher_prompts(batch)
        out = Batch()
        if self.k is not None:
            out, _ = role.teacher_topk(view, k=self.k, temperature=self.temperature)
        if "teacher_logprobs" in self.spec.outputs:
            logprobs, _ = role.forward_logprobs(view, output_key="teacher_logprobs")
            out = out.union(logprobs)
        return NodeResult(out, {})
