"""Rules for where the distillation teacher runs (a standalone teacher's engine rules are the vllm
backend's: dagrl/backends/vllm/rules.py).

A colocated teacher is the actor's train backend, forward-only, on the train devices; a
standalone teacher is vLLM replicas on `teacher.gpus` devices of their own. Asking for both (a
colocated teacher plus a teacher group of its own) would load two teachers, so it is refused.
"""

from __future__ import annotations

from dagrl.config.schema import DagrlConfig, TeacherPlacement
from dagrl.errors import ConfigError

T = "teacher"


def check_teacher_placement(cfg: DagrlConfig) -> None:
    """Config-only rules on where the teacher runs (the plan's groups are checked after planning)."""
    t = cfg.teacher
    others = [g for g in cfg.placement.colocate_groups if T in g and len(g) > 1]
    if t.placement == TeacherPlacement.standalone:
        if others:
            raise ConfigError(
                "placement.colocate_groups",
                list(map(list, cfg.placement.colocate_groups)),
                f"a standalone teacher owns its devices; take '{T}' out of {list(others[0])}"
                f" (or set {T}.placement=colocate)",
            )
        asked = cfg.placement.gpus.get(T)
        if asked is not None and t.gpus and asked != t.gpus:
            raise ConfigError(
                f"placement.gpus.{T}",
                asked,
                f"a standalone teacher's devices are {T}.gpus={t.gpus}; set that and leave placement.gpus.{T} unset",
            )
        return
    alone = [g for g in cfg.placement.colocate_groups if T in g and "train" not in g]
    if cfg.placement.gpus.get(T) is not None or alone:
        raise ConfigError(
            f"{T}.placement",
            "colocate",
            f"a colocated teacher ({T}.model on the train devices) together with a teacher group of its own"
            f" would load two teachers: for vLLM replicas on devices of their own set {T}.placement=standalone"
            f" {T}.gpus=N; to keep it colocated, drop placement.gpus.{T} and the '{T}' group",
        )


def check_teacher_group(cfg: DagrlConfig, group_roles: list[str], workers: int) -> None:
    """The planned group of the teacher (any placement form, device_groups included)."""
    t = cfg.teacher
    if t.placement == TeacherPlacement.standalone:
        if group_roles != [T]:
            raise ConfigError(
                "placement.device_groups",
                group_roles,
                f"a standalone teacher owns its devices: give '{T}' a group of its own (workers: [{T}])",
            )
        if t.gpus and workers != t.gpus:
            raise ConfigError(
                f"{T}.gpus",
                t.gpus,
                f"the teacher's group has {workers} devices; make {T}.gpus and the group's ranks agree",
            )
    elif "train" not in group_roles:
        raise ConfigError(
            f"{T}.placement",
            "colocate",
            f"the teacher is in group {group_roles} without the trainer: a colocated teacher shares the train"
            f" devices. For vLLM replicas on devices of their own set {T}.placement=standalone {T}.gpus={workers};"
            f" otherwise list '{T}' in the trainer's group",
        )
