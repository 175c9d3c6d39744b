"""Placement planning: roles → colocate groups → device slots on the declared cluster.

The plan is made against `trainer.nnodes × trainer.n_gpus_per_node`, not against what this
machine has, so an 8-GPU job can be dry-run on a laptop. Slots are numbered node-major
(slot s lives on node s // n_gpus_per_node); groups take consecutive slots in order.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field

from dagrl.config.device_groups import parse_device_groups
from dagrl.config.role_specs import build_role_specs
from dagrl.config.roles import Role, RoleSpec
from dagrl.config.schema import DagrlConfig, TeacherPlacement
from dagrl.errors import ConfigError, PlacementError
from dagrl.registry import BACKENDS

__all__ = ["Plan", "make_plan", "format_plan"]


@dataclass
class RoleLayout:
    """One role's place in the plan: its colocate group, how many workers (devices) it spans, and
    how they split into data-parallel ranks of TP × PP × CP model replicas."""

    role: str
    group: int
    workers: int
    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1


@dataclass
class GroupPlan:
    roles: list[str]
    slots: list[int]  # global slot indices
    device: str | None = None  # "cpu" for a CPU group of device_groups; None = the plan's device

    def nodes(self, n_gpus_per_node: int) -> dict[int, list[int]]:
        """node index -> local device indices."""
        out: dict[int, list[int]] = {}
        for s in self.slots:
            out.setdefault(s // n_gpus_per_node, []).append(s % n_gpus_per_node)
        return out


@dataclass
class Plan:
    """Where every role runs: the colocate groups with their device slots, each role's layout
    (workers, TP/PP/CP, DP) and spec, and the memory estimate per device; printed by a dry run,
    read by launch to reserve placement-group bundles and start the pools."""

    nnodes: int
    n_gpus_per_node: int
    device: str  # "cpu" or "cuda"
    groups: list[GroupPlan]
    roles: dict[str, RoleLayout]
    specs: dict[str, RoleSpec] = field(default_factory=dict)
    memory_gib: dict[str, float] = field(default_factory=dict)  # role -> estimate per device
    offloaded_gib: dict[str, float] = field(default_factory=dict)  # role -> host memory per device

    @property
    def total_slots(self) -> int:
        return sum(len(g.slots) for g in self.groups)

    @property
    def device_slots(self) -> int:
        """Bundles with the plan's device to reserve: up to the highest slot a device group uses."""
        used = [s for g in self.groups if g.device is None for s in g.slots]
        return max(used) + 1 if used else 0

    def device_of(self, group: GroupPlan) -> str:
        return group.device or self.device

    def group_of(self, role: str) -> GroupPlan:
        return self.groups[self.roles[role].group]


def make_plan(cfg: DagrlConfig, roles: Iterable[str] | dict[str, RoleSpec], device: str) -> Plan:
    """Assign each role's colocate group a block of slots; raise PlacementError if they do not fit.

    `roles` are role specs (dagrl/config/roles.py) or names to build them for.
    """
    specs = roles if isinstance(roles, dict) else build_role_specs(cfg, roles)
    t = cfg.trainer
    total = t.nnodes * t.n_gpus_per_node
    if cfg.placement.device_groups is not None:
        plans = _device_group_plans(cfg, set(specs), total)
    else:
        groups = _groups_for(cfg, set(specs))
        sizes = _group_sizes(cfg, groups, total)
        plans, next_slot = [], 0
        for roles_in_group, size in zip(groups, sizes):
            plans.append(GroupPlan(roles=roles_in_group, slots=list(range(next_slot, next_slot + size))))
            next_slot += size
    layouts = {}
    for gi, g in enumerate(plans):
        for role in g.roles:
            par = specs[role].parallel
            tp, pp, cp, model_parallel = par.tp, par.pp, par.cp, par.model_parallel
            if len(g.slots) % model_parallel:
                raise PlacementError(
                    f"role {role!r} has {len(g.slots)} devices, not a multiple of TP×PP×CP = {tp}×{pp}×{cp};"
                    f" change placement.gpus.{role} or the role's parallel sizes"
                )
            layouts[role] = RoleLayout(role, gi, len(g.slots), len(g.slots) // model_parallel, tp, pp, cp)
    return Plan(t.nnodes, t.n_gpus_per_node, device, plans, layouts, specs=specs)


def _device_group_plans(cfg: DagrlConfig, roles: set[str], total: int) -> list[GroupPlan]:
    """device_groups → groups: GPU groups on their ranks, CPU groups on slots after the devices."""
    parsed = parse_device_groups(cfg.placement.device_groups, cfg.trainer.n_gpus_per_node, total)
    missing = roles - {r for _, _, group_roles, _ in parsed for r in group_roles}
    if missing:
        raise PlacementError(
            f"the DAG runs roles {sorted(missing)} that no group of placement.device_groups lists in its workers"
        )
    plans, next_cpu = [], total
    for name, device, group_roles, slots in parsed:
        members = [r for r in group_roles if r in roles]
        if not members:  # its devices would sit idle: say so rather than drop them
            raise PlacementError(
                f"placement.device_groups.{name} lists workers {group_roles}, none of which this job runs"
                f" (its DAG runs {sorted(roles)}): drop the group, or give its devices to a role that runs"
            )
        if device == "cpu":
            plans.append(GroupPlan(members, list(range(next_cpu, next_cpu + slots)), device="cpu"))
            next_cpu += slots
        else:
            plans.append(GroupPlan(members, list(slots)))
    return plans


def _groups_for(cfg: DagrlConfig, roles: set[str]) -> list[list[str]]:
    groups, seen = [], set()
    check_role_names(cfg, roles)
    for i, group in enumerate(cfg.placement.colocate_groups):
        dup = seen & set(group)
        if dup:
            raise PlacementError(
                f"placement.colocate_groups[{i}] repeats role(s) {sorted(dup)}: a role belongs to one group"
            )
        seen |= set(group)
        members = [r for r in group if r in roles]
        if members:
            groups.append(members)
    if Role.teacher in roles - seen and cfg.teacher.placement == TeacherPlacement.colocate:
        # a colocated teacher shares the train devices unless colocate_groups says otherwise
        home = next((g for g in groups if Role.train in g), None)
        if home is not None:
            home.append(Role.teacher.value)
            seen.add(Role.teacher.value)
    if Role.critic in roles - seen:
        # the critic takes turns with the actor on its devices unless colocate_groups places it
        home = next((g for g in groups if Role.train in g), None)
        if home is not None:
            home.append(Role.critic.value)
            seen.add(Role.critic.value)
    groups += [[r] for r in sorted(roles - seen)]  # roles in no group own their devices
    return groups


def check_role_names(cfg: DagrlConfig, roles: set[str]) -> None:
    """Every role named in placement.colocate_groups is a built-in role, a plugin role of
    `roles` (the DAG's) or of cfg.roles: a misspelt one would otherwise own devices of its own."""
    known = sorted({k.value for k in Role} | set(cfg.roles) | roles)
    for i, group in enumerate(cfg.placement.colocate_groups):
        for j, name in enumerate(group):
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
                raise ConfigError(
                    f"placement.colocate_groups[{i}][{j}]",
                    name,
                    "no such role"
                    + (f"; did you mean {near[0]!r}?" if near else "")
                    + f" (roles: {', '.join(known)})",
                )


def _group_sizes(cfg: DagrlConfig, groups: list[list[str]], total: int) -> list[int]:
    gpus = cfg.placement.gpus
    sizes: list[int | None] = []
    for group in groups:
        asked = {r: gpus.get(r) for r in group if gpus.get(r) is not None}
        if (
            Role.teacher in group
            and cfg.teacher.placement == TeacherPlacement.standalone
            and cfg.teacher.gpus
        ):
            asked[Role.teacher.value] = cfg.teacher.gpus
        if len(set(asked.values())) > 1:
            raise PlacementError(
                f"colocated roles {group} ask for different device counts {asked}: colocated roles share"
                f" devices, so set the same placement.gpus for each of them"
            )
        sizes.append(next(iter(asked.values()), None))
    fixed = sum(s for s in sizes if s is not None)
    free = [i for i, s in enumerate(sizes) if s is None]
    for group, size in zip(groups, sizes):
        if size is not None and size < 1:
            role = next(r for r in group if gpus.get(r) is not None or r == Role.teacher)
            key = "teacher.gpus" if gpus.get(role) is None else f"placement.gpus.{role}"
            raise ConfigError(key, size, f"role {role!r} needs at least one device; set it to 1 or more")
    if free:
        share, rest = divmod(total - fixed, len(free))
        if share < 1:
            named = [r for i in free for r in groups[i]]
            raise ConfigError(
                f"placement.gpus.{named[0]}",
                None,
                f"no device is left for role(s) {named}: placement.gpus takes {fixed} of the {total}"
                " (trainer.nnodes × trainer.n_gpus_per_node); lower the others' placement.gpus,"
                f" set placement.gpus.{named[0]}, or grow the cluster",
            )
        if rest:
            raise PlacementError(
                f"cannot split the {total - fixed} devices left (of trainer.nnodes×trainer.n_gpus_per_node ="
                f" {total}) evenly among groups {[groups[i] for i in free]}; set placement.gpus.<role>"
                " (a standalone teacher: teacher.gpus) or grow the cluster"
            )
        for i in free:
            sizes[i] = share
    if sum(sizes) > total:
        raise PlacementError(
            f"roles ask for {sum(sizes)} devices ({dict(zip(map(tuple, groups), sizes))}) but the cluster"
            f" declares trainer.nnodes×trainer.n_gpus_per_node = {total}; lower placement.gpus or grow the cluster"
        )
    return sizes


def format_plan(plan: Plan) -> str:
    kind = "GPU" if plan.device == "cuda" else "CPU slot"
    lines = [f"cluster: {plan.nnodes} node(s) × {plan.n_gpus_per_node} {kind}(s), {plan.total_slots} used"]
    for gi, g in enumerate(plan.groups):
        if g.device == "cpu":
            where = f"{len(g.slots)} CPU worker(s), any node"
        else:
            where = ", ".join(f"node {n}: {kind}s {ids}" for n, ids in g.nodes(plan.n_gpus_per_node).items())
        mode = "colocated" if len(g.roles) > 1 else "separate"
        lines.append(f"group {gi} ({mode}): roles {g.roles} on {where}")
        for role in g.roles:
            r = plan.roles[role]
            lines.append(
                f"  {role}: {r.workers} workers, DP={r.dp} TP={r.tp} PP={r.pp} CP={r.cp}{_backend(plan, role)}"
                f"{_memory(plan, role)}"
            )
            lines += _lora_sync(plan, role)
    idle = idle_slots(plan)
    if idle:
        lines.append(
            f"idle: {kind}s {idle} of the declared {plan.nnodes}×{plan.n_gpus_per_node} run no role: the roles'"
            " device counts (placement.gpus.*, teacher.gpus, device_groups ranks) add up to less; raise them,"
            " or declare a smaller cluster (trainer.n_gpus_per_node)"
        )
    return "\n".join(lines)


def _backend(plan: Plan, role: str) -> str:
    """', rollout engine vllm' / ', train backend torch (forward only)': what the role runs."""
    spec = plan.specs.get(role)
    if spec is None:
        return ""
    if spec.kind == Role.rollout:
        return f", rollout engine {spec.backend}"
    if spec.kind == Role.teacher and BACKENDS.backend(spec.backend).standalone_teacher:
        return f", engine {spec.backend} (standalone teacher)"
    if spec.kind in (Role.train, Role.ref, Role.teacher):
        return f", train backend {spec.backend}" + ("" if spec.trains else " (forward only)")
    return f", backend {spec.backend}"


def _lora_sync(plan: Plan, role: str) -> list[str]:
    """The rollout's LoRA sync, and why where auto chose it."""
    spec = plan.specs.get(role)
    lora = spec.lora if spec is not None and spec.kind == Role.rollout else None
    if lora is None:
        return []
    how = f"auto -> {lora.sync.value} ({lora.sync_reason})" if lora.sync_reason else lora.sync.value
    return [f"    actor_rollout_ref.rollout.lora_sync: {how}"]


def idle_slots(plan: Plan) -> list[int]:
    """Device slots of the declared cluster that no group uses."""
    used = {s for g in plan.groups if g.device is None for s in g.slots}
    return [s for s in range(plan.nnodes * plan.n_gpus_per_node) if s not in used]


def _memory(plan: Plan, role: str) -> str:
    mem = plan.memory_gib.get(role)
    if mem is None:
        return ""
    spec = plan.specs.get(role)
    what = "params+grads+optimizer" if spec is not None and spec.trains else "weights or engine share"
    text = f", est. {mem:.2f} GiB/device {what} kept between phases"
    host = plan.offloaded_gib.get(role)
    if host:
        text += f" (+{host:.2f} GiB/device offloaded to host memory between phases)"
    return text
