"""The memory plan: per device and per phase of a step, what every colocated role keeps resident.

A step runs in phases (rollout, old log-probs, reference log-probs, teacher, the critic's values
and update, the actor's update); in each, one
role of a colocate group has the device (its weights, gradients, optimizer state and the phase's
activations and logits, or an engine's pool) while the others keep what their offload policy
leaves there (each backend's registered `estimate`, backends/*/memory.py). A phase's total adds those, plus the CUDA
context every process pays outside the allocator and, on more than one GPU, the NCCL communicators
its roles make (backends/communicators.py). The dry run prints the table; a real run
refuses, before Ray starts, a phase whose total exceeds the card (dagrl/trainer/capacity.py),
naming the phase and the keys that lower it.

Devices of a group carry the same load (DP shards are equal, TP/PP shards are split evenly), so the
table has one block per colocate group. CPU groups are not planned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dagrl.backends.communicators import GROUP_BYTES, nccl_bytes
from dagrl.backends.memory import GIB, RoleMemory, param_width, parts_total
from dagrl.backends.model_shape import ModelShape, read_model_shape
from dagrl.backends.weight_pipeline import sync_buffer_bytes
from dagrl.config.placement import Plan, RoleLayout
from dagrl.config.roles import Role, RoleSpec
from dagrl.config.schema import DagrlConfig
from dagrl.registry import BACKENDS

# CUDA context, cuBLAS workspace, NCCL buffers: outside the allocator. A one-GPU worker held 0.51 GiB
# at vLLM's start (H200, 2026-11-28); a sleeping engine's non-torch memory (0.22) and buffers are
# inside this too, its CUDA graphs are its own (backends/vllm/memory.py: asleep_bytes). The NCCL
# communicators of a worker in a pool of several are not: they count on their own (`nccl`)
CONTEXT_BYTES = 1.0 * GIB

# (phase, the role that has the device, the phase of the role's estimate), in the order a step runs
# them; a sampling job's sampler samples as a rollout does, reward models score in a phase each
PHASES = (
    ("weight_sync", Role.train, "weight_sync"),  # what a sync makes (a LoRA merge), engine awake
    ("rollout", Role.rollout, "rollout"),
    ("rollout", Role.sampler, "rollout"),
    ("rm", Role.rm, "score"),
    ("orm", Role.orm, "score"),
    ("prm", Role.prm, "score"),
    ("old_logprob", Role.train, "old_logprob"),
    ("ref_logprob", Role.ref, "ref_logprob"),
    ("teacher", Role.teacher, "teacher"),
    ("values", Role.critic, "values"),
    ("critic_update", Role.critic, "critic_update"),
    ("update", Role.train, "update"),
)


@dataclass
class PhaseRow:
    """One phase on one group's device: the role that has it, its parts, what the others leave."""

    phase: str
    role: str
    parts: dict[str, float]  # the active role's parts (bytes)
    others: dict[str, float]  # colocated role -> bytes it leaves on the device
    total: float
    resident: bool = False  # nothing is handed over: the others' bytes are their cached peaks
    # per pipeline stage where they differ; total holds the largest
    stages: list[float] = field(default_factory=list)
    nccl: float = 0.0  # the device's process's NCCL communicators, in every phase alike


@dataclass
class GroupMemory:
    """The phases of one colocate group's devices (its devices carry the same load)."""

    group: int
    roles: list[str]
    rows: list[PhaseRow]
    # the NCCL communicators of the process on each device, name -> bytes (none on one GPU)
    communicators: dict[str, float] = field(default_factory=dict)


@dataclass
class MemoryPlan:
    """The per-device, per-phase table the dry run prints and a real run checks against the card:
    one `GroupMemory` per GPU group, in bytes."""

    card_bytes: float
    card_source: str
    groups: list[GroupMemory]
    notes: list[str] = field(default_factory=list)  # defaults chosen from the plan, roles not counted
    # node -> role -> host bytes its roles keep there (offloaded state, a host optimizer, an
    # engine's weights asleep), over all the role's devices on that node
    host: dict[int, dict[str, float]] = field(default_factory=dict)

    def peak(self, phase: str | None = None) -> float:
        """The largest total of `phase` (None: of any phase) over the groups, in bytes."""
        return max((r.total for g in self.groups for r in g.rows if phase in (None, r.phase)), default=0.0)

    def over(self) -> list[tuple[GroupMemory, PhaseRow]]:
        """(group, phase) pairs whose total exceeds the card, largest first; among equals (a device
        where nothing is handed over carries every role's peak in every phase) the phase whose own
        parts make the peak, so that its levers are the ones named."""
        found = [(g, r) for g in self.groups for r in g.rows if r.total > self.card_bytes]
        own = lambda r: parts_total(r.parts) - r.parts.get("cached", 0.0)  # noqa: E731
        return sorted(found, key=lambda gr: (-gr[1].total, -own(gr[1])))


# DAG node kind -> the phase it runs in (validation and driver-side nodes take no device phase)
NODE_PHASES = {
    "weight_sync": "weight_sync",
    "rollout": "rollout",
    "old_logprob": "old_logprob",
    "ref_logprob": "ref_logprob",
    "teacher_logprob": "teacher",
    "teacher_hidden": "teacher",
    "actor_update": "update",
    "rm_score": "rm",
    "orm_score": "orm",
    "prm_score": "prm",
    "values": "values",
    "critic_update": "critic_update",
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
        add_sync_buffers(cfg, plan, roles, shapes)
        for node, devices in group.nodes(plan.n_gpus_per_node).items():
            for role, mem in roles.items():
                if mem.host:
                    on_node = out.host.setdefault(node, {})
                    on_node[role] = on_node.get(role, 0.0) + mem.host * len(devices)
        made = process_communicators(roles)
        rows = [r for r in _rows(roles, nccl_bytes(made)) if phases is None or r.phase in phases]
        out.groups.append(GroupMemory(gi, list(group.roles), rows, made))
    return out


def _rows(roles: dict[str, RoleMemory], nccl: float) -> list[PhaseRow]:
    """Each phase's row, with `nccl` (the device's communicators) in each. Where no role of the
    device hands anything over (a role alone, or every one `stays`: an engine kept awake beside a
    trainer that offloads nothing), the worker never empties torch's cache, so what a role held at
    its largest stays reserved in every phase: the active role's row gains it as `cached`, the
    others count their peak."""
    rows = []
    resident = len(roles) == 1 or all(m.stays for m in roles.values())
    for phase, role, own in PHASES:
        if role not in roles or own not in roles[role].phases:
            continue
        mem = roles[role]
        parts = {**mem.active, **mem.phases[own]}
        if resident and mem.peak() > parts_total(parts):
            parts["cached"] = mem.peak() - parts_total(parts)
        others = {r: m.peak() if resident else parts_total(m.idle) for r, m in roles.items() if r != role}
        total = CONTEXT_BYTES + nccl + parts_total(parts) + sum(others.values())
        stages = [total - parts_total(parts) + parts_total(stage) for stage in mem.stages.get(own, [])]
        rows.append(PhaseRow(phase, role, parts, others, total, resident, stages, nccl))
    return rows


def process_communicators(roles: dict[str, RoleMemory]) -> dict[str, float]:
    """The communicators of the process the group's roles share on each device: each name once."""
    return {name: size for mem in roles.values() for name, size in mem.communicators.items()}


def _shapes(cfg: DagrlConfig, plan: Plan, model_path: str) -> dict[str | None, ModelShape]:
    """Model path (as the specs name it) -> shape: the actor's, and every other role's (a teacher, a
    reward model, a sampler's) whose config.json is here (a hub id is not counted)."""
    trust = cfg.actor_rollout_ref.model.trust_remote_code
    shapes = {cfg.actor_rollout_ref.model.path: read_model_shape(model_path, trust)}
    for spec in plan.specs.values():
        path = spec.model.path
        if path is None or path in shapes:
            continue
        local = os.path.abspath(os.path.expanduser(path))
        if os.path.isfile(os.path.join(local, "config.json")):
            shapes[path] = read_model_shape(local, spec.model.trust_remote_code)
    return shapes


# ---- one role ------------------------------------------------------------------------------------


def role_memory(
    cfg: DagrlConfig, spec: RoleSpec, layout: RoleLayout, shape: ModelShape, card: float, colocated: int
) -> RoleMemory:
    """A role's footprint per device, by the estimate its backend registered (none: not counted)."""
    entry = BACKENDS.find(spec.kind, spec.backend)
    if entry is None or entry.estimate is None:
        return RoleMemory({}, {})  # a plugin backend that brings no estimate
    return entry.estimate(cfg, spec, layout, shape, card, colocated)


def record_resident_memory(cfg: DagrlConfig, plan: Plan, model_path: str, card_gib: float | None) -> None:
    """The plan's per-role figures, from the same estimates as the table: `plan.memory_gib` what a
    role keeps on each of its devices between its turns (weights, gradients and optimizer state
    its offload policy leaves there, or an engine's share), `plan.offloaded_gib` what it keeps in
    host memory. Roles whose model shape or estimate is unknown here get no figure."""
    shapes = _shapes(cfg, plan, model_path)
    card = (card_gib or 0.0) * GIB  # only engines' pools scale with the card
    for group in plan.groups:
        roles = {}
        for role in group.roles:
            spec = plan.specs[role]
            shape = shapes.get(spec.model.path)
            entry = BACKENDS.find(spec.kind, spec.backend)
            if shape is None or entry is None or entry.estimate is None:
                continue
            roles[role] = entry.estimate(cfg, spec, plan.roles[role], shape, card, len(group.roles))
        if plan.device_of(group) == "cuda":
            add_sync_buffers(cfg, plan, roles, shapes)
        for role, mem in roles.items():
            plan.memory_gib[role] = parts_total(mem.idle) / GIB
            if mem.host:
                plan.offloaded_gib[role] = mem.host / GIB


def add_sync_buffers(
    cfg: DagrlConfig, plan: Plan, roles: dict[str, RoleMemory], shapes: dict[str | None, ModelShape]
) -> None:
    """Where the trainer and the rollout engine have devices of their own, the weight sync's
    broadcast buffers (backends/weight_pipeline.py: two buckets per side): kept by the engine's
    devices between syncs, made on the trainer's for each sync (its rank 0's; every device of
    the group is planned alike); and the broadcast group's NCCL communicator on both sides
    (backends/weight_broadcast.py: the trainer's rank 0 and every engine worker, made at the first
    sync)."""
    if Role.train not in plan.roles or Role.rollout not in plan.roles:
        return
    if plan.group_of(Role.train) is plan.group_of(Role.rollout):
        return  # colocated: the refresh is an in-process copy
    spec = plan.specs[Role.rollout]
    shape = shapes.get(spec.model.path)
    if shape is None:
        return
    limit = cfg.actor_rollout_ref.rollout.weight_sync_bucket_mb * 2.0**20
    size = sync_buffer_bytes(limit, shape.params * param_width(spec.model.dtype))
    if Role.rollout in roles:
        roles[Role.rollout].active["sync_buffers"] = size
        roles[Role.rollout].idle["sync_buffers"] = size
        roles[Role.rollout].communicators["weight sync"] = GROUP_BYTES
    if Role.train in roles:
        own = roles[Role.train].phases
        own["weight_sync"] = {**own.get("weight_sync", {}), "sync_buffers": size}
        roles[Role.train].communicators["weight sync"] = GROUP_BYTES


# ---- the table -----------------------------------------------------------------------------------


def format_memory_plan(mp: MemoryPlan) -> str:
    """The per-phase table, one block per GPU group, GiB per device."""
    lines = [f"memory plan (GiB per device; card {mp.card_bytes / GIB:.0f} GiB, {mp.card_source}):"]
    for g in mp.groups:
        lines.append(f"  group {g.group} ({', '.join(g.roles)}):")
        for row in g.rows:
            flag = "  OVER" if row.total > mp.card_bytes else ""
            lines.append(f"    {row.phase:<12} {row.total / GIB:7.2f}{flag}  = {describe(row)}")
            if row.stages:  # the figure above is the largest stage's
                each = ", ".join(f"{t / GIB:.2f}" for t in row.stages)
                lines.append(f"      {row.role}'s pipeline stages, first to last: {each}")
        if g.communicators:
            lines.append(
                f"    nccl: {nccl_bytes(g.communicators) / GIB:.2f} in each process, its communicators "
                f"{', '.join(g.communicators)} (the first's set-up included)"
            )
    for node, roles in sorted(mp.host.items()):
        lines.append(
            f"  host memory of node {node}: {sum(roles.values()) / GIB:.2f} GiB = {describe_host(roles)}"
        )
    lines += [f"  note: {n}" for n in mp.notes]
    return "\n".join(lines)


def describe_host(roles: dict[str, float]) -> str:
    return " + ".join(f"{role} {size / GIB:.2f}" for role, size in roles.items())


def describe(row: PhaseRow) -> str:
    """One line of what is resident in a phase: the active role's parts, the others, the context
    and the NCCL communicators (none on one GPU)."""
    own = " + ".join(f"{k} {v / GIB:.2f}" for k, v in row.parts.items())
    text = f"{row.role}: {own}"
    for role, size in row.others.items():
        text += f"; {role} {'cached' if row.resident else 'idle'} {size / GIB:.2f}"
    text += f"; context {CONTEXT_BYTES / GIB:.2f}"
    return text + (f"; nccl {row.nccl / GIB:.2f}" if row.nccl else "")
