"""Rules for the distillation teacher's placement and a standalone (vLLM) teacher's engine.

A colocated teacher is the actor's train backend, forward-only, on the train devices; a
standalone teacher is vLLM replicas on `teacher.gpus` devices of their own. Asking for both (a
colocated teacher plus a teacher group of its own) would load two teachers, so it is refused.
"""

from __future__ import annotations

import importlib.util

from dagrl.config.schema import Algorithm, DagrlConfig, TeacherPlacement
from dagrl.errors import ConfigError

T = "teacher"
TOPK = "algorithm.gkd.gkd_logits_topk"


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
        check_standalone_engine(cfg)
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


def check_standalone_engine(cfg: DagrlConfig) -> None:
    """Top-k only, within vLLM's max_logprobs; engine kwargs dagrl sets itself are refused."""
    from dagrl.backends.vllm.engine_args import (
        TEACHER_RESERVED_ENGINE_KWARGS,
        VLLM_DEFAULT_MAX_LOGPROBS,
        teacher_max_model_len,
    )

    t, g = cfg.teacher, cfg.algorithm.gkd
    for key, value in t.engine_kwargs.items():
        if key in TEACHER_RESERVED_ENGINE_KWARGS:
            raise ConfigError(
                f"{T}.engine_kwargs.{key}",
                value,
                f"dagrl sets this itself; use {TEACHER_RESERVED_ENGINE_KWARGS[key]}",
            )
    if cfg.algorithm.name != Algorithm.gkd:
        return
    if g.gkd_logits_topk is None:
        raise ConfigError(
            TOPK,
            None,
            "a standalone (vLLM) teacher returns top-k log-probs only, never the full vocabulary: set"
            f" {TOPK}=K (e.g. 64) and {T}.engine_kwargs.max_logprobs >= K",
        )
    max_logprobs = t.engine_kwargs.get("max_logprobs", VLLM_DEFAULT_MAX_LOGPROBS)
    if max_logprobs != -1 and max_logprobs < g.gkd_logits_topk:
        raise ConfigError(
            f"{T}.engine_kwargs.max_logprobs",
            max_logprobs,
            f"vLLM returns at most max_logprobs prompt log-probs per position (default"
            f" {VLLM_DEFAULT_MAX_LOGPROBS}) and {TOPK}={g.gkd_logits_topk}: set"
            f" +{T}.engine_kwargs.max_logprobs={g.gkd_logits_topk} or lower {TOPK}",
        )
    needed = teacher_max_model_len(cfg)
    context = t.engine_kwargs.get("max_model_len", needed)
    if context < needed:
        raise ConfigError(
            f"{T}.engine_kwargs.max_model_len",
            context,
            f"must hold data.max_prompt_length + data.max_response_length + 1 = {needed} (one token is"
            " sampled after prompt + response); raise it or leave it unset",
        )


def check_teacher_device(cfg: DagrlConfig, device: str) -> None:
    """A standalone teacher is vLLM: GPUs only, installed where the run starts (not for a dry run)."""
    t = cfg.teacher
    if t.model is None or t.placement != TeacherPlacement.standalone or cfg.trainer.dry_run:
        return
    if device != "cuda":
        raise ConfigError(
            f"{T}.placement",
            "standalone",
            "a standalone teacher runs vLLM, which needs GPUs: set trainer.device=cuda on a GPU machine,"
            f" or {T}.placement=colocate",
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{T}.placement", "standalone", "vllm is not installed here; pip install -e '.[vllm]'"
        )
