"""Placement planning: roles → colocate groups → device slots on the declared cluster.

The plan is made against `trainer.nnodes × trainer.n_gpus_per_node`, not against what this
machine has, so an 8-GPU job can be dry-run on a laptop. Slots are numbered node-major
(slot s lives on node s // n_gpus_per_node); groups take consecutive slots in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dagrl.config.device_groups import parse_device_groups
from dagrl.config.roles import Role, RoleSpec, build_role_specs
from dagrl.config.schema import DagrlConfig, TeacherPlacement
from dagrl.errors import PlacementError

__all__ = ["Plan", "make_plan", "format_plan"]


@dataclass
class RoleLayout:
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
    missing = roles - {r for _, group_roles, _ in parsed for r in group_roles}
    if missing:
        raise PlacementError(
            f"the DAG runs roles {sorted(missing)} that no group of placement.device_groups lists in its workers"
        )
    plans, next_cpu = [], total
    for device, group_roles, slots in parsed:
        members = [r for r in group_roles if r in roles]
        if not members:
            continue  # a group for roles this DAG does not use
        if device == "cpu":
            plans.append(GroupPlan(members, list(range(next_cpu, next_cpu + slots)), device="cpu"))
            next_cpu += slots
        else:
            plans.append(GroupPlan(members, list(slots)))
    return plans


def _groups_for(cfg: DagrlConfig, roles: set[str]) -> list[list[str]]:
    groups, seen = [], set()
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
    groups += [[r] for r in sorted(roles - seen)]  # roles in no group own their devices
    return groups


def _group_sizes(cfg: DagrlConfig, groups: list[list[str]], total: int) -> list[int]:
    gpus = cfg.placement.gpus
    sizes: list[int | None] = []
    for group in groups:
        asked = {r: gpus.get(r) for r in group if gpus.get(r) is not None}
        if Role.teacher in group and cfg.teacher.placement == TeacherPlacement.standalone:
            asked[Role.teacher.value] = cfg.teacher.gpus
        if len(set(asked.values())) > 1:
            raise PlacementError(
                f"colocated roles {group} ask for different device counts {asked}: colocated roles share"
                f" devices, so set the same placement.gpus for each of them"
            )
        sizes.append(next(iter(asked.values()), None))
    fixed = sum(s for s in sizes if s is not None)
    free = [i for i, s in enumerate(sizes) if s is None]
    if free:
        share, rest = divmod(total - fixed, len(free))
        if share < 1 or rest:
            raise PlacementError(
                f"cannot split the {total - fixed} devices left (of trainer.nnodes×trainer.n_gpus_per_node ="
                f" {total}) evenly among groups {[groups[i] for i in free]}; set placement.gpus.<role>"
            )
        for i in free:
            sizes[i] = share
    if sum(sizes) > total:
        raise PlacementError(
            f"roles ask for {sum(sizes)} devices ({dict(zip(map(tuple, groups), sizes))}) but the cluster"
            f" declares trainer.nnodes×trainer.n_gpus_per_node = {total}; lower placement.gpus or grow the cluster"
        )
    if any(s < 1 for s in sizes):
        raise PlacementError(
            f"every role needs at least one device; got {dict(zip(map(tuple, groups), sizes))}"
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
                f"  {role}: {r.workers} workers, DP={r.dp} TP={r.tp} PP={r.pp} CP={r.cp}{_memory(plan, role)}"
            )
    return "\n".join(lines)


def _memory(plan: Plan, role: str) -> str:
    mem = plan.memory_gib.get(role)
    if mem is None:
        return ""
    spec = plan.specs.get(role)
    what = "params+grads+optimizer" if spec is not None and spec.trains else "weights"
    text = f", est. {mem:.2f} GiB/device {what}"
    host = plan.offloaded_gib.get(role)
    if host:
        text += f" (+{host:.2f} GiB/device offloaded to host memory between phases)"
    return text
