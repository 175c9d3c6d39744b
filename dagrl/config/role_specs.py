"""Each role's spec from the config: what a worker builds its backend from (a `RoleSpec`). The
parts (the spec types and the train, rollout and teacher settings) are dagrl/config/roles.py's; the
critic's and the sampling roles' specs come from their own modules, which build on the same parts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from dagrl.config.critic_role import critic_spec
from dagrl.config.roles import (
    ModelSpec,
    OffloadPolicy,
    ParallelLayout,
    Role,
    RoleSpec,
    SequenceLimits,
    _layout,
    _offload,
    _section,
    _train_settings,
    policy_lora,
    rollout_dtype,
    teacher_model_path,
)
from dagrl.config.sampling_roles import SAMPLING_ROLES, plugin_spec, sampling_spec
from dagrl.config.schema import DagrlConfig, TeacherPlacement
from dagrl.registry import BACKENDS


def build_role_specs(cfg: DagrlConfig, roles: Iterable[str]) -> dict[str, RoleSpec]:
    """Specs of the named roles (those the DAG uses), in name order."""
    return {name: role_spec(cfg, name) for name in sorted(set(roles))}


def role_spec(cfg: DagrlConfig, name: str) -> RoleSpec:
    """The spec of role `name` (a `Role` member, a sampling role or a plugin role's name)."""
    d = cfg.data
    limits = SequenceLimits(d.max_prompt_length, d.max_response_length)
    spec = _role_spec(cfg, name)
    return replace(spec, seed=cfg.trainer.seed, lengths=limits, card_gib=cfg.trainer.gpu_memory_gib)


def _role_spec(cfg: DagrlConfig, name: str) -> RoleSpec:
    arr = cfg.actor_rollout_ref
    actor_model = ModelSpec(arr.model.path, arr.model.dtype, None, arr.model.trust_remote_code)
    strategy_key = "actor_rollout_ref.actor.strategy"
    if name in (Role.train, Role.ref):
        trains = name == Role.train
        mega = _section(cfg, trains)
        return RoleSpec(
            name=name,
            kind=name,
            backend=arr.actor.strategy,
            backend_key=strategy_key,
            model=actor_model,
            parallel=_layout(cfg, mega),
            micro_batch_size=(
                arr.actor.ppo_micro_batch_size_per_gpu
                if trains
                else arr.ref.log_prob_micro_batch_size_per_gpu
            ),
            logprob_micro_batch_size=(
                arr.rollout.log_prob_micro_batch_size_per_gpu  # the old log-probs of the update
                if trains
                else arr.ref.log_prob_micro_batch_size_per_gpu
            ),
            trains=trains,
            offload=_offload(cfg, mega),
            megatron=mega,
            train=_train_settings(cfg, trains),
            lora=policy_lora(cfg) if trains else None,  # a separate reference is the base
        )
    if name == Role.rollout:
        r = arr.rollout
        return RoleSpec(
            name=name,
            kind=name,
            backend=r.name,
            backend_key="actor_rollout_ref.rollout.name",
            model=ModelSpec(arr.model.path, rollout_dtype(cfg), None, arr.model.trust_remote_code),
            parallel=ParallelLayout(tp=r.tensor_model_parallel_size),
            micro_batch_size=r.micro_batch_size_per_gpu,
            rollout=r,
            lora=policy_lora(cfg),
        )
    if name == Role.teacher:
        return _teacher_spec(cfg, actor_model)
    if name == Role.critic:
        return critic_spec(cfg)
    if name in SAMPLING_ROLES:
        return sampling_spec(cfg, name, actor_model)
    return plugin_spec(cfg, name, actor_model)


def standalone_teacher_backend() -> str:
    """The backend serving teacher.placement=standalone (replicas of their own): the one registered
    as such (dagrl.registry.Backend.standalone_teacher)."""
    names = [n for n in BACKENDS.names(Role.teacher.value) if BACKENDS.backend(n).standalone_teacher]
    assert len(names) == 1, f"one backend serves a standalone teacher, got {names}"
    return names[0]


def _teacher_spec(cfg: DagrlConfig, actor_model: ModelSpec) -> RoleSpec:
    t, arr = cfg.teacher, cfg.actor_rollout_ref
    model = ModelSpec(teacher_model_path(cfg), t.dtype or arr.model.dtype, None, arr.model.trust_remote_code)
    if t.placement == TeacherPlacement.standalone:
        return RoleSpec(
            name=Role.teacher.value,
            kind=Role.teacher.value,
            backend=standalone_teacher_backend(),
            backend_key="teacher.placement",
            model=model,
            parallel=ParallelLayout(tp=t.tensor_model_parallel_size),
            micro_batch_size=t.log_prob_micro_batch_size_per_gpu,
            logprob_micro_batch_size=t.log_prob_micro_batch_size_per_gpu,
            engine_kwargs=dict(t.engine_kwargs),
        )
    mega = _section(cfg, trains=False)
    return RoleSpec(
        name=Role.teacher.value,
        kind=Role.teacher.value,
        backend=arr.actor.strategy,
        backend_key="actor_rollout_ref.actor.strategy",  # the actor's train backend, forward-only
        model=model,
        parallel=_layout(cfg, mega),
        micro_batch_size=t.log_prob_micro_batch_size_per_gpu,
        logprob_micro_batch_size=t.log_prob_micro_batch_size_per_gpu,
        offload=OffloadPolicy(params=t.offload),
        megatron=mega,
        train=_train_settings(cfg, trains=False),
    )
