"""The role specs beyond the RL step's own: the sampling pipeline's sampler and reward models
(dagrl/sample, dagrl/backends/reward_model.py), GRPO's reward model role (`rm`), and plugin roles
declared under `roles.<name>`; built from dagrl/config/roles.py's parts, as the critic's are
(critic_role.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagrl.config.roles import (
    KIND_REWARD_MODEL,
    ModelSpec,
    ParallelLayout,
    Role,
    RoleSpec,
    _sampler_dtype,
    rollout_dtype,
    teacher_model_path,
)
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError


@dataclass
class PluginRoleConfig:
    """`roles.<name>` as a section: what a reward, judge or other plugin role runs."""

    backend: str  # the name its plugin registered with @register_backend("<role name>", backend)
    model: str | None = None  # the role's own model path; None = the actor's model
    dtype: str | None = None  # None = the actor's model dtype
    micro_batch_size: int = 1  # sequences per forward on one device
    trust_remote_code: bool | None = None  # None = the actor's setting
    tensor_model_parallel_size: int = 1  # devices one model replica spans (consecutive workers)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # the backend's own settings, passed as given


def plugin_spec(cfg: DagrlConfig, name: str, actor_model: ModelSpec) -> RoleSpec:
    """Reward and plugin roles: the backend a plugin registered under the role's name, with the
    role's own model section when `roles.<name>` is one (the actor's model otherwise)."""
    entry = cfg.roles.get(name, "")  # validate_roles refuses a DAG role without an entry
    if isinstance(entry, str):
        return RoleSpec(name=name, kind=name, backend=entry, backend_key=f"roles.{name}", model=actor_model)
    known = set(PluginRoleConfig.__dataclass_fields__)
    for key in entry:
        if key not in known:
            raise ConfigError(
                f"roles.{name}.{key}", entry[key], f"unknown key; a role's section has {sorted(known)}"
            )
    if "backend" not in entry:
        raise ConfigError(
            f"roles.{name}.backend", None, "name the backend its plugin registered for this role"
        )
    section = PluginRoleConfig(**entry)
    model = ModelSpec(
        section.model if section.model is not None else actor_model.path,
        section.dtype or actor_model.dtype,
        None,
        actor_model.trust_remote_code if section.trust_remote_code is None else section.trust_remote_code,
    )
    return RoleSpec(
        name=name,
        kind=name,
        backend=section.backend,
        backend_key=f"roles.{name}.backend",
        model=model,
        parallel=ParallelLayout(tp=section.tensor_model_parallel_size),
        micro_batch_size=section.micro_batch_size,
        logprob_micro_batch_size=section.micro_batch_size,
        engine_kwargs=dict(section.engine_kwargs),
    )


SAMPLING_ROLES = (Role.sampler, Role.orm, Role.prm, Role.rm)


def sampling_spec(cfg: DagrlConfig, name: str, actor_model: ModelSpec) -> RoleSpec:
    """sampler: a rollout backend on the policy's model, or the teacher's (sampler_type=distill);
    orm / prm / rm: a reward model's forward-only backend on its own model."""
    from dagrl.config.sample_schema import RewardModelType, SamplerType

    dtype, trust = cfg.actor_rollout_ref.model.dtype, cfg.actor_rollout_ref.model.trust_remote_code
    if name == Role.sampler:
        r, distill = cfg.actor_rollout_ref.rollout, cfg.sample.sampler_type == SamplerType.distill
        model = (
            ModelSpec(teacher_model_path(cfg), _sampler_dtype(cfg, cfg.teacher.dtype or dtype), None, trust)
            if distill
            else ModelSpec(actor_model.path, rollout_dtype(cfg), None, trust)
        )
        return RoleSpec(
            name=name,
            kind=Role.rollout,
            backend=r.name,
            backend_key="actor_rollout_ref.rollout.name",
            model=model,
            parallel=ParallelLayout(tp=r.tensor_model_parallel_size),
            micro_batch_size=r.micro_batch_size_per_gpu,
            rollout=r,
        )
    path, key = {
        Role.orm: (cfg.sample.orm_model, "sample.orm_model"),
        Role.prm: (cfg.sample.prm_model, "sample.prm_model"),
        Role.rm: (cfg.reward.model.path, "reward.model.path"),
    }[name]
    backend, m = "hf", cfg.reward.model
    if name == Role.rm and m.type == RewardModelType.generative:
        backend, key = f"{m.engine.value}_judge", "reward.model.engine"  # dagrl/backends/judge.py
    if name == Role.rm and m.backend is not None:
        backend, key = m.backend, "reward.model.backend"
    return RoleSpec(
        name=name,
        kind=KIND_REWARD_MODEL,
        backend=backend,
        backend_key=key,
        model=ModelSpec(path, dtype, None, trust),
        micro_batch_size=cfg.reward.model.micro_batch_size_per_gpu,
        reward_model=m if name == Role.rm else None,
    )
