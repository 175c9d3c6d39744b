"""The memory plan: per device and per phase of a step, what every colocated role keeps resident.

A step runs in phases (rollout, old log-probs, reference log-probs, teacher, update); in each, one
role of a colocate group has the device (its weights, gradients, optimizer state and the phase's
activations and logits, or an engine's pool) while the others keep what their offload policy
leaves there (backends/*/memory.py estimate each part). A phase's total adds those, plus the CUDA
context every process pays outside the allocator. The dry run prints the table; a real run
refuses, before Ray starts, a phase whose total exceeds the card (dagrl/trainer/capacity.py),
naming the phase and the keys that lower it.

Devices of a group carry the same load (DP shards are equal, TP/PP shards are split evenly), so the
table has one block per colocate group. CPU groups are not planned.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from dagrl.backends.hf import memory as hf_memory
from dagrl.backends.megatron import memory as megatron_memory
from dagrl.backends.memory import GIB, Workload, parts_total
from dagrl.backends.model_shape import ModelShape, read_model_shape
from dagrl.backends.torch import memory as torch_memory
from dagrl.backends.vllm import memory as vllm_memory
from dagrl.config.placement import Plan, RoleLayout
from dagrl.config.roles import Role, RoleSpec, teacher_model_path
from dagrl.config.schema import DagrlConfig

CONTEXT_BYTES = 1.0 * GIB  # CUDA context, cuBLAS workspace, NCCL buffers: outside the allocator

A, R, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"

# phase -> the role that has the device, in the order a step runs them
PHASES = (
    ("rollout", Role.rollout),
    ("old_logprob", Role.train),
    ("ref_logprob", Role.ref),
    ("teacher", Role.teacher),
    ("update", Role.train),
)


@dataclass
class RoleMemory:
    """One role's bytes per device: `active` while it has the device (besides a phase's own
    transient parts in `phases`), `idle` while a colocated role has it, `host` kept in host memory."""

    active: dict[str, float]
    idle: dict[str, float]
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    host: float = 0.0


@dataclass
class PhaseRow:
    phase: str
    role: str
    parts: dict[str, float]  # the active role's parts (bytes)
    others: dict[str, float]  # colocated role -> bytes it leaves on the device
    total: float


@dataclass
class GroupMemory:
    group: int
    roles: list[str]
    rows: list[PhaseRow]


@dataclass
class MemoryPlan:
    card_bytes: float
    card_source: str
    groups: list[GroupMemory]
    notes: list[str] = field(default_factory=list)  # defaults chosen from the plan, roles not counted

    def over(self) -> list[tuple[GroupMemory, PhaseRow]]:
        """(group, phase) pairs whose total exceeds the card, largest first."""
        found = [(g, r) for g in self.groups for r in g.rows if r.total > self.card_bytes]
        return sorted(found, key=lambda gr: -gr[1].total)


# DAG node kind -> the phase it runs in (validation and driver-side nodes take no device phase)
NODE_PHASES = {
    "rollout": "rollout",
    "old_logprob": "old_logprob",
    "ref_logprob": "ref_logprob",
    "teacher_logprob": "teacher",
    "teacher_hidden": "teacher",
    "actor_update": "update",
}


def dag_phases(node_kinds) -> set[str]:
    """The phases a step's DAG runs (e.g. no old_logprob phase when recompute_old_logprobs=false)."""
    return {NODE_PHASES[k] for k in node_kinds if k in NODE_PHASES}


def plan_memory(
    cfg: DagrlConfig,
    plan: Plan,
    model_path: str,
    card_gib: float,
    source: str,
    phases: set[str] | None = None,
) -> MemoryPlan:
    """The per-phase table of every GPU group of `plan`, for the `phases` the DAG runs (None: all)."""
    shapes = _shapes(cfg, plan, model_path)
    card = card_gib * GIB
    out = MemoryPlan(card, source, [])
    for gi, group in enumerate(plan.groups):
        if plan.device_of(group) != "cuda":
            continue
        roles = {}
        for role in group.roles:
            shape = shapes.get(plan.specs[role].model.path)
            if shape is None:
                out.notes.append(f"role {role}: model shape unknown here, not counted")
                continue
            roles[role] = role_memory(cfg, plan.specs[role], plan.roles[role], shape, card, len(group.roles))
        rows = [r for r in _rows(roles) if phases is None or r.phase in phases]
        out.groups.append(GroupMemory(gi, list(group.roles), rows))
    return out


def _rows(roles: dict[str, RoleMemory]) -> list[PhaseRow]:
    rows = []
    for phase, role in PHASES:
        if role not in roles or phase not in roles[role].phases:
            continue
        mem = roles[role]
        parts = {**mem.active, **mem.phases[phase]}
        others = {r: parts_total(m.idle) for r, m in roles.items() if r != role}
        total = CONTEXT_BYTES + parts_total(parts) + sum(others.values())
        rows.append(PhaseRow(phase, role, parts, others, total))
    return rows


def _shapes(cfg: DagrlConfig, plan: Plan, model_path: str) -> dict[str | None, ModelShape]:
    """Model path (as the specs name it) -> shape, for the actor and a teacher whose config is here."""
    trust = cfg.actor_rollout_ref.model.trust_remote_code
    shapes = {cfg.actor_rollout_ref.model.path: read_model_shape(model_path, trust)}
    teacher = teacher_model_path(cfg) if Role.teacher in plan.specs else None
    if teacher is not None and teacher not in shapes:
        local = os.path.abspath(os.path.expanduser(teacher))
        if os.path.isfile(os.path.join(local, "config.json")):
            shapes[teacher] = read_model_shape(local, trust)
    return shapes


# ---- one role ------------------------------------------------------------------------------------


def role_memory(
    cfg: DagrlConfig, spec: RoleSpec, layout: RoleLayout, shape: ModelShape, card: float, colocated: int
) -> RoleMemory:
    """A role's footprint per device, by its backend's own estimate."""
    if spec.backend == "vllm":
        return _vllm_memory(cfg, spec, shape, card, colocated)
    if spec.backend == "hf":
        work = _workload(cfg, spec.micro_batch_size, None, layout.dp)
        parts = hf_memory.generate_bytes(shape, _width(spec.model.dtype), work)
        weights = {"weights": parts.pop("weights")}
        return RoleMemory(weights, {}, {"rollout": parts})  # offload() moves its model to the CPU
    if spec.backend == "megatron":
        return _megatron_memory(cfg, spec, layout, shape)
    if spec.backend == "torch":
        return _torch_memory(cfg, spec, layout, shape)
    return RoleMemory({}, {})  # a plugin backend: its own estimate is not known here


def _vllm_memory(
    cfg: DagrlConfig, spec: RoleSpec, shape: ModelShape, card: float, colocated: int
) -> RoleMemory:
    if spec.kind == Role.teacher:  # standalone: its own devices, never asleep
        from dagrl.backends.vllm.engine_args import TEACHER_GPU_MEMORY_UTILIZATION

        util = cfg.teacher.engine_kwargs.get("gpu_memory_utilization", TEACHER_GPU_MEMORY_UTILIZATION)
        pool = vllm_memory.pool_bytes(util, card)
        return RoleMemory({}, pool, {"teacher": pool})
    r = cfg.actor_rollout_ref.rollout
    sleeps = r.free_cache_engine and colocated > 1
    host = vllm_memory.host_bytes(shape, _width(spec.model.dtype), spec.parallel.tp, r.sleep_level, sleeps)
    idle = vllm_memory.idle_bytes(r.gpu_memory_utilization, card, sleeps)
    return RoleMemory({}, idle, {"rollout": vllm_memory.pool_bytes(r.gpu_memory_utilization, card)}, host)


def _torch_memory(cfg: DagrlConfig, spec: RoleSpec, layout: RoleLayout, shape: ModelShape) -> RoleMemory:
    arr, width = cfg.actor_rollout_ref, _width(spec.model.dtype)
    on_host = spec.trains and arr.actor.optimizer_cpu_offload  # the optimizer step on the host
    state = torch_memory.state_bytes(shape, width, spec.trains, on_host)
    kept = torch_memory.between_updates(state, width, on_host)
    mem = RoleMemory(kept, torch_memory.idle_bytes(kept, spec.offload.params))
    if on_host:
        mem.host = shape.params * 16.0  # fp32 master, its gradient, m, v
    elif spec.offload.params:
        mem.host = parts_total(kept) - kept.get("grads", 0.0)
    for phase, work in _forward_phases(cfg, spec, layout.dp).items():
        mem.phases[phase] = torch_memory.forward_bytes(shape, width, work)
    if spec.trains:
        recompute = bool(arr.model.gradient_checkpointing)
        update = torch_memory.update_bytes(shape, width, update_workload(cfg, layout.dp), recompute)
        mem.phases["update"] = {k: v for k, v in state.items() if k not in kept} | update
    return mem


def _megatron_memory(cfg: DagrlConfig, spec: RoleSpec, layout: RoleLayout, shape: ModelShape) -> RoleMemory:
    m = spec.megatron
    mlayout = megatron_memory.MegatronLayout(
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        dp=layout.dp,
        ep=m.expert_model_parallel_size,
        etp=m.expert_tensor_parallel_size or layout.tp,
        workers=layout.workers,
        sequence_parallel=m.sequence_parallel,
    )
    fraction = m.optimizer_offload_fraction if m.optimizer_cpu_offload else 0.0  # on the host
    state, host = megatron_memory.state_bytes(
        shape, mlayout, m.param_dtype, spec.trains, m.use_distributed_optimizer, fraction
    )
    idle = megatron_memory.idle_bytes(state, spec.offload.params, spec.offload.grads, spec.offload.optimizer)
    mem = RoleMemory(state, idle, host=host + parts_total(state) - parts_total(idle))
    width = megatron_memory.param_width(m.param_dtype)
    for phase, work in _forward_phases(cfg, spec, layout.dp).items():
        mem.phases[phase] = megatron_memory.forward_bytes(shape, width, mlayout, work)
    if spec.trains:
        work = update_workload(cfg, layout.dp)
        mem.phases["update"] = megatron_memory.update_bytes(
            shape, width, mlayout, work, recompute_layers(m, shape)
        )
    return mem


def recompute_layers(m, shape: ModelShape) -> int:
    """Layers per pipeline stage whose activations megatron recomputes (full recompute only;
    selective recompute saves the attention scores, which flash attention never keeps)."""
    if getattr(m.recompute_granularity, "value", m.recompute_granularity) != "full":
        return 0
    stage = shape.layers // m.pipeline_model_parallel_size
    if getattr(m.recompute_method, "value", m.recompute_method) == "block":
        return min(stage, m.recompute_num_layers or stage)
    return stage


# ---- workloads -----------------------------------------------------------------------------------


def _seq(cfg: DagrlConfig) -> tuple[int, int]:
    d = cfg.data
    return d.max_prompt_length + d.max_response_length, d.max_response_length


def _workload(
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
    return _workload(cfg, a.ppo_micro_batch_size_per_gpu, budget, dp, mini_rows)


def _forward_phases(cfg: DagrlConfig, spec: RoleSpec, dp: int) -> dict[str, Workload]:
    """The forward-only passes a train-backend role runs, with their workloads."""
    arr = cfg.actor_rollout_ref
    if spec.kind == Role.train:
        r = arr.rollout
        budget = r.log_prob_max_token_len_per_gpu if r.log_prob_use_dynamic_bsz else None
        return {"old_logprob": _workload(cfg, r.log_prob_micro_batch_size_per_gpu, budget, dp)}
    if spec.kind == Role.ref:
        budget = arr.ref.log_prob_max_token_len_per_gpu if arr.ref.log_prob_use_dynamic_bsz else None
        return {"ref_logprob": _workload(cfg, arr.ref.log_prob_micro_batch_size_per_gpu, budget, dp)}
    if spec.kind == Role.teacher:
        return {"teacher": _workload(cfg, cfg.teacher.log_prob_micro_batch_size_per_gpu, None, dp)}
    return {}


def _width(dtype) -> int:
    return megatron_memory.param_width(dtype)


# ---- the table -----------------------------------------------------------------------------------


def format_memory_plan(mp: MemoryPlan) -> str:
    """The per-phase table, one block per GPU group, GiB per device."""
    lines = [f"memory plan (GiB per device; card {mp.card_bytes / GIB:.0f} GiB, {mp.card_source}):"]
    for g in mp.groups:
        lines.append(f"  group {g.group} ({', '.join(g.roles)}):")
        for row in g.rows:
            flag = "  OVER" if row.total > mp.card_bytes else ""
            lines.append(f"    {row.phase:<12} {row.total / GIB:7.2f}{flag}  = {describe(row)}")
    lines += [f"  note: {n}" for n in mp.notes]
    return "\n".join(lines)


def describe(row: PhaseRow) -> str:
    """One line of what is resident in a phase: the active role's parts, the others, the context."""
    own = " + ".join(f"{k} {v / GIB:.2f}" for k, v in row.parts.items())
    text = f"{row.role}: {own}"
    for role, size in row.others.items():
        text += f"; {role} idle {size / GIB:.2f}"
    return text + f"; context {CONTEXT_BYTES / GIB:.2f}"
