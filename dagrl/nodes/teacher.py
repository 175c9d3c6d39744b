"""teacher_logprob / teacher_hidden: what the teacher says about the student's responses (distillation).

Top-k distillation runs teacher_logprob (the teacher's top-k next tokens, [B, R, K]); full-vocabulary
distillation runs teacher_hidden (the teacher's final hidden states, [B, R, H']), from which the
train backend recomputes the teacher's logits chunk by chunk inside the loss: a [B, R, V] teacher
output per step is what runs out of memory at a 151,936-word vocabulary (docs/distillation.md).
"""

from __future__ import annotations

from dagrl.backends.handles import teacher_role, train_role
from dagrl.config.schema import Algorithm, TeacherPlacement
from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives.distill import distill_topk

_INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")


@register_node_kind("teacher_logprob")
class TeacherLogprobNode:
    """Runs the teacher on prompt + response; outputs [B, R, K] ids and log-probs over the whole
    vocabulary at algorithm.gkd.temperature (K = gkd_logits_topk).

    The teacher is colocated (a forward-only train backend) or standalone (vLLM replicas on GPUs of
    their own, teacher.placement=standalone); the latter reads `teacher_prompts` when the DAG
    passes them (OPSD). On its own pool it runs alongside the driver's reward node."""

    required_inputs = ("prompts", "prompt_mask", "responses", "response_mask")
    optional_inputs = ("teacher_prompts", "teacher_prompt_mask")
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
        out, per_replica = teacher_role(runtime, self.spec.role).teacher_topk(
            batch, k=self.k, temperature=self.temperature
        )
        return NodeResult(out, replica_metrics(per_replica))


def replica_metrics(per_replica: list[dict]) -> dict[str, float]:
    """Replicas run in parallel: seconds are the slowest one's, throughput and counts add up."""
    out: dict[str, float] = {}
    for metrics in per_replica:
        for key, value in metrics.items():
            add = key.endswith(("per_s", "positions"))
            out[key] = out.get(key, 0.0) + value if add else max(out.get(key, value), value)
    return out


def _take_device(worker, role: str) -> None:
    worker.activate(role)


@register_node_kind("handover")
class HandoverNode:
    """Gives the devices of the role's colocate group to the role ahead of its next call.

    With a standalone teacher, the GKD step's actor update waits for the teacher's scores; the
    train GPUs meanwhile hold the sleeping-to-be rollout engine. Handing them to the trainer right
    after the rollout (engine asleep, trainer state back on the GPU) runs that switch while the
    teacher scores, instead of at the start of the update. Disabled with a colocated teacher: it
    needs the same devices next, and an early switch would be undone."""

    required_inputs = ()
    optional_inputs = ()
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.teacher.placement == TeacherPlacement.standalone

    def run(self, runtime, batch):
        pool = runtime.role(self.spec.role).pool
        with pool.lock:  # calls into one pool reach its workers in one order
            pool.get([a.run.remote(_take_device, self.spec.role) for a in pool.actors])
        return NodeResult(Batch(), {})


@register_node_kind("teacher_hidden")
class TeacherHiddenNode:
    """Runs the (colocated) teacher forward on prompt + response; outputs its final hidden states at
    the positions that predict each response token, [B, R, H'] (full-vocabulary distillation)."""

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
