"""What the backends' memory estimates share: the workload of one forward, the parts a role
keeps on a device (`RoleMemory`), and the workloads of the passes a role runs.

Each backend estimates its own footprint in its own module (backends/torch/memory.py,
backends/megatron/memory.py, backends/vllm/memory.py, backends/hf/memory.py) as pure functions of
the model's shape, the role's spec and a `Workload`, and registers the estimate with itself
(`register_backend(..., estimate=)`, dagrl/backends/builtin.py); dagrl/trainer/memory_plan.py asks
the registered estimate of each role and adds up what every colocated role keeps on a device in
each phase of a step. All figures are bytes per device.

An estimate is called as `estimate(cfg, spec, layout, shape, card_bytes, colocated) -> RoleMemory`:
the role's spec and placement layout, the model's shape, the card's size and how many roles share
the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dagrl.algos.distillation import chunk_tokens_for
from dagrl.config.roles import Role, RoleSpec
from dagrl.config.schema import DagrlConfig

GIB = 2**30

# the critic's phases (role critic): the rows of its estimates (torch/memory.py, megatron/memory.py)
# and the prefixes of the device figures its backends report (torch/critic.py, megatron/critic.py),
# one name for both so that the run's figure sits beside the plan's
VALUES_PHASE, CRITIC_UPDATE_PHASE = "values", "critic_update"

_WIDTH = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def share_of_card(utilization: float, card_gib: float, device_gib: float) -> float:
    """An engine's share of the whole device (vLLM's gpu_memory_utilization: it takes share x the
    device's total) for `utilization` of the card the memory plan counted (trainer.gpu_memory_gib,
    `card_gib`) on a device of `device_gib`: on a larger device (one shared with other work, or a
    smaller card emulated) the share shrinks to the bytes the plan counted. A figure above the
    device's leaves the share as set: that figure overrides the plan's check, not the device."""
    return round(utilization * min(card_gib, device_gib) / device_gib, 4)


def param_width(param_dtype) -> int:
    """Bytes per element of a dtype name (or its enum)."""
    return _WIDTH[getattr(param_dtype, "value", param_dtype)]


@dataclass
class RoleMemory:
    """One role's bytes per device: `active` while it has the device (besides a phase's own
    transient parts in `phases`), `idle` while a colocated role has it, `host` kept in host memory.
    `stays`: its hand-over moves nothing off the device (its offload returns False); where every
    role of a device stays, the worker never empties torch's cache (core/worker.py: settle), so
    each role's largest phase stays reserved through every phase (trainer/memory_plan.py)."""

    active: dict[str, float]
    idle: dict[str, float]
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    host: float = 0.0
    stays: bool = False
    # phase -> one dict per pipeline stage of the role's bytes while it has the device (state and
    # the phase's parts), where its stages differ; `active` and `phases` hold the largest stage's
    stages: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    # the NCCL communicators its processes make, name -> bytes (backends/communicators.py): a name
    # another role of the same process gives is the same communicator
    communicators: dict[str, float] = field(default_factory=dict)

    def peak(self) -> float:
        """The most it holds in any phase (what torch's cache keeps where nothing empties it)."""
        held = [parts_total({**self.active, **own}) for own in self.phases.values()]
        return max([parts_total(self.idle), parts_total(self.active), *held])


@dataclass(frozen=True)
class Workload:
    """One forward on one device: `rows` sequences of `seq` tokens each (prompt + response, as the
    backend lays them out), the last `response` of which are scored. `micro_batches`: how many such
    forwards one optimizer step runs on this device (pipeline schedules keep several in flight)."""

    rows: int
    seq: int
    response: int
    micro_batches: int = 1

    @property
    def tokens(self) -> int:
        return self.rows * self.seq


def parts_total(parts: dict[str, float]) -> float:
    return float(sum(parts.values()))


# ---- workloads of the passes a role runs -------------------------------------------------------


def _seq(cfg: DagrlConfig) -> tuple[int, int]:
    d = cfg.data
    return d.max_prompt_length + d.max_response_length, d.max_response_length


def workload(
    cfg: DagrlConfig, micro_rows: int, budget: int | None, dp: int, rows_per_device=None
) -> Workload:
    """The largest forward of a pass: `micro_rows` sequences, or as many whole sequences as the
    token `budget` holds (at least one), never more than the device's share of the batch."""
    seq, response = _seq(cfg)
    if rows_per_device is None:
        rows_per_device = max(1, cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // dp)
    rows = max(1, budget // seq) if budget is not None else micro_rows
    rows = min(rows, rows_per_device)
    return Workload(rows, seq, response, math.ceil(rows_per_device / rows))


def update_workload(cfg: DagrlConfig, dp: int) -> Workload:
    a = cfg.actor_rollout_ref.actor
    mini_rows = max(1, a.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // dp)
    budget = a.ppo_max_token_len_per_gpu if a.use_dynamic_bsz else None
    return workload(cfg, a.ppo_micro_batch_size_per_gpu, budget, dp, mini_rows)


def forward_phases(cfg: DagrlConfig, spec: RoleSpec, dp: int) -> dict[str, Workload]:
    """The forward-only passes a train-backend role runs, with their workloads."""
    arr = cfg.actor_rollout_ref
    if spec.kind == Role.train:
        r = arr.rollout
        budget = r.log_prob_max_token_len_per_gpu if r.log_prob_use_dynamic_bsz else None
        return {"old_logprob": workload(cfg, r.log_prob_micro_batch_size_per_gpu, budget, dp)}
    if spec.kind == Role.ref:
        budget = arr.ref.log_prob_max_token_len_per_gpu if arr.ref.log_prob_use_dynamic_bsz else None
        return {"ref_logprob": workload(cfg, arr.ref.log_prob_micro_batch_size_per_gpu, budget, dp)}
    if spec.kind == Role.teacher:
        return {"teacher": workload(cfg, cfg.teacher.log_prob_micro_batch_size_per_gpu, None, dp)}
    return {}


def teacher_forward_bytes(shape, width: int, work: Workload, tp: int = 1, cp: int = 1) -> dict[str, float]:
    """A teacher's pass (its top-K ids and log-probs, or its final hidden states: both backends'
    teacher_topk / teacher_hidden), the transient part: a forward without grad ends at the final
    hidden states, and the output layer then runs over the response positions a chunk of tokens at
    a time (algos/distillation.py chunk_tokens_for), never over every position at once. The peak is
    the larger of
    - a layer's transients, per token: its MLP's gate, up and their product (3 i / TP, model
      dtype) beside the residual stream and its normed copy (2 h);
    - the final hidden states (h per token) and one chunk's logits: the product in the model dtype,
      its fp32 copy, scaled copy and log-softmax (w + 12 B an element).
    On an H200 (session 27's gkd-0.6b-1.7b: a 1.7B teacher, 64 rows x 384 tokens) the allocator's
    peak above the phase's start read 0.85 GiB; this counts 1.03 (the whole logits, as a log-prob
    pass makes them, would be 4.65)."""
    tokens = work.tokens / cp
    layer = width * tokens * (3 * shape.intermediate / tp + 2 * shape.hidden)
    vocab = math.ceil(shape.vocab / tp)
    chunk = min(chunk_tokens_for(vocab), work.rows * work.response)
    head = width * tokens * shape.hidden + chunk * vocab * (width + 12)
    return {"activations": float(layer)} if layer >= head else {"logits": float(head)}
