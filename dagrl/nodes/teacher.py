"""teacher_logprob / teacher_hidden: the teacher's view of the student's responses (distillation).

Outputs what its DAG declares of:
- teacher_topk_ids / teacher_topk_logprobs [B, R, K]: the teacher's top-k next tokens at every
  response position, log-probs over the whole vocabulary at algorithm.gkd.temperature (GKD, OPSD);
- teacher_hidden [B, R, H'] (node teacher_hidden, full-vocabulary GKD/OPSD): the teacher's final
  hidden states, from which the train backend recomputes the teacher's logits chunk by chunk inside
  the loss: a [B, R, V] teacher output per step is what runs out of memory at a 151,936-word
  vocabulary (docs/distillation.md);
- teacher_logprobs [B, R]: the teacher's log-probs of the sampled tokens at the rollout
  temperature (on-policy distillation as a reward, algorithm.distill_reward).

OPSD (under algorithm=gkd as under opsd, as in ms-swift): with `teacher_prompts` among its inputs, the teacher reads each row's privileged prompt
followed by the *same* response token ids (never re-tokenised text). Prompts are left-padded and
responses right-padded, so response token r is predicted at column P' − 1 + r of every row, as
after the student's prompt: the teacher's outputs land on the student's [B, R] response grid and
the loss compares them token by token under `response_mask`. The swap happens here, before the
backend is called, so every train backend serves OPSD through its plain teacher calls. Rows
without a privileged prompt carry their own prompt there (collate), i.e. plain GKD.

Multi-turn rows (actor_rollout_ref.rollout.multi_turn): the response holds the policy's turns and
the observations between them. The teacher reads the whole episode — `response_attention_mask`
(1 on every real token) is what its forward attends to — so its distribution at a policy token
is conditioned on the tool outputs the student saw; it still fills every cell of the [B, R]
grid, and the losses count only `response_mask`'s policy tokens. For OPSD the privileged prompt
replaces the prompt and the multi-turn response stays as sampled.
"""

from __future__ import annotations

from dagrl.backends.handles import teacher_role, train_role
from dagrl.backends.vllm.rules import check_standalone_topk, refuse_standalone_full_vocab
from dagrl.config.roles import Role
from dagrl.config.schema import TeacherPlacement
from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives import build_objective
from dagrl.objectives.distill import HIDDEN_KEY, TOPK_KEYS

_TOPK = ("teacher_topk_ids", "teacher_topk_logprobs")


_INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")
_OPTIONAL = ("teacher_prompts", "teacher_prompt_mask", "response_attention_mask")


def with_teacher_prompts(batch: Batch) -> Batch:
    """The batch the teacher scores: its privileged prompts in place of the student's, when given;
    a multi-turn row's response_attention_mask kept (the observations are read)."""
    view = batch.select((*_INPUTS, "response_attention_mask"))
    if "teacher_prompts" not in batch:
        return view
    swapped = {"prompts": batch["teacher_prompts"], "prompt_mask": batch["teacher_prompt_mask"]}
    held = {k: h for k, h in view.held.items() if k not in swapped}  # responses may stay on workers
    tensors = {**view.tensors, **swapped}
    return Batch(tensors, view.meta, held, batch.repeats_of(tensors, view.meta))


def teacher_inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required, optional): multi-turn rows need response_attention_mask, or the teacher would not
    read the observations the student saw."""
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        return (*_INPUTS, "response_attention_mask"), _OPTIONAL[:2]
    return _INPUTS, _OPTIONAL


def prompt_kinds(batch: Batch) -> dict[str, float]:
    """How many rows the teacher scores after a privileged prompt (OPSD) and after the student's own
    (plain GKD: no or an empty teacher_prompt, which collate filled with the row's prompt)."""
    if "teacher_prompts" not in batch:
        return {}
    tp, tm = batch["teacher_prompts"], batch["teacher_prompt_mask"]
    p, m = batch["prompts"], batch["prompt_mask"]
    width = min(tp.shape[1], p.shape[1])  # left-padded: equal prompts end in the same columns
    same = (tm.sum(1) == m.sum(1)) & ((tp[:, -width:] == p[:, -width:]) | (m[:, -width:] == 0)).all(1)
    plain = int(same.sum())
    return {"distill/opsd_rows": float(len(same) - plain), "distill/gkd_rows": float(plain)}


@register_node_kind("teacher_logprob")
class TeacherLogprobNode:
    """The teacher's top-k at every response position and/or its log-probs of the sampled tokens.

    The teacher is colocated (a forward-only train backend) or standalone (vLLM replicas on GPUs of
    their own, teacher.placement=standalone, top-k only). On its own pool it runs alongside the
    driver's reward node."""

    required_inputs = _INPUTS
    optional_inputs = _OPTIONAL
    outputs = (*_TOPK, "teacher_logprobs")
    remote = True

    inputs_for = staticmethod(teacher_inputs_for)

    def __init__(self, spec, cfg):
        self.spec = spec
        self.k = cfg.algorithm.gkd.gkd_logits_topk if set(_TOPK) & set(spec.outputs) else None
        self.temperature = cfg.algorithm.gkd.temperature

    @staticmethod
    def check_config(cfg, spec) -> None:
        """A standalone teacher asked for its top-k: K within vLLM's max_logprobs."""
        if _standalone(cfg, spec) and set(_TOPK) & set(spec.outputs):
            check_standalone_topk(cfg)

    @staticmethod
    def enabled(cfg) -> bool:
        """When the objective reads the teacher's top-k, or the distillation reward its log-probs."""
        return objective_reads(cfg, TOPK_KEYS) or cfg.algorithm.distill_reward.coef != 0

    def run(self, runtime, batch):
        view = with_teacher_prompts(batch)
        out, metrics = Batch(), {}
        if self.k is not None:
            out, per_replica = teacher_role(runtime, self.spec.role).teacher_topk(
                view, k=self.k, temperature=self.temperature
            )
            metrics = replica_metrics(per_replica)
        if "teacher_logprobs" in self.spec.outputs:
            logprobs, _ = train_role(runtime, self.spec.role).forward_logprobs(
                view, output_key="teacher_logprobs"
            )
            out = out.union(logprobs)
        return NodeResult(out, {**metrics, **prompt_kinds(batch)})


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
    optional_inputs = _OPTIONAL
    outputs = ("teacher_hidden",)
    remote = True

    inputs_for = staticmethod(teacher_inputs_for)

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def check_config(cfg, spec) -> None:
        """A standalone (vLLM) teacher has no hidden states to hand over: top-k only."""
        if _standalone(cfg, spec):
            refuse_standalone_full_vocab()

    @staticmethod
    def enabled(cfg) -> bool:
        """When the objective reads the teacher's hidden states (full-vocabulary distillation)."""
        return objective_reads(cfg, (HIDDEN_KEY,))

    def run(self, runtime, batch):
        out, per_rank = train_role(runtime, self.spec.role).teacher_hidden(with_teacher_prompts(batch))
        return NodeResult(out, {**reduce_all(per_rank), **prompt_kinds(batch)})


def objective_reads(cfg, keys: tuple[str, ...]) -> bool:
    """Whether the configured objective requires all of `keys`: a node producing them runs for
    whatever objective reads them (GKD, OPSD, a plugin's), not for a list of algorithm names."""
    return set(keys) <= set(build_objective(cfg).required_keys)


def _standalone(cfg, spec) -> bool:
    """The node runs on the teacher role and the teacher is vLLM replicas of its own."""
    return spec.role == Role.teacher and cfg.teacher.placement == TeacherPlacement.standalone
