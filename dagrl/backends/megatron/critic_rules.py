"""Rules of the megatron critic (critic.strategy=megatron, critic.megatron.*), checked before Ray
starts: the splits and optimizer settings the actor's section is held to, what the value model
does not do, and the layout it must share with a colocated megatron actor."""

from __future__ import annotations

from dataclasses import replace

from dagrl.backends.megatron.precision_rules import check_optimizer_section, runs_on_cpu
from dagrl.backends.megatron.rules import (
    _check_layer_split,
    _check_megatron_kernels,
    _check_megatron_sizes,
    _check_recompute,
    _check_tensor_split,
)
from dagrl.config.critic_role import critic_spec
from dagrl.config.roles import Role, RoleSpec
from dagrl.config.schema import DagrlConfig, MegatronConfig, RecomputeGranularity, RecomputeMethod
from dagrl.errors import ConfigError

C = "critic.megatron"
# megatron's parallel groups are per process: a colocated actor and critic share them
SHARED_LAYOUT = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def check_megatron_critic(cfg: DagrlConfig) -> None:
    m = critic_megatron(critic_spec(cfg))
    if m.pipeline_model_parallel_size > 1:
        raise ConfigError(
            f"{C}.pipeline_model_parallel_size",
            m.pipeline_model_parallel_size,
            "the megatron critic is not pipelined: its value head replaces the output layer on a"
            " single stage (a tied embedding's copy on the last stage is not handled); use 1 and"
            f" split the trunk with {C}.tensor_model_parallel_size",
        )
    _check_megatron_sizes(C, m)
    _check_megatron_kernels(C, m)  # refuses context parallel too
    check_optimizer_section(C, m, runs_on_cpu(cfg))
    hf = _critic_hf_config(cfg)
    _check_critic_architecture(hf)
    _check_tensor_split(C, m, hf)
    _check_layer_split(C, m, hf)
    _check_recompute(C, m, hf)


def _check_critic_architecture(hf) -> None:
    """The architectures and rope settings the megatron trunk computes exactly (model.py), refused
    here under the critic's own keys rather than in a worker under the actor's."""
    from dagrl.backends.megatron.model import _check_architecture, rope_kwargs

    try:
        _check_architecture(hf)
        rope_kwargs(hf)
    except ConfigError as e:
        fix = e.fix.replace("actor_rollout_ref.actor.strategy=torch", "critic.strategy=torch")
        raise ConfigError("critic.model.path", e.value, fix) from e


def _critic_hf_config(cfg: DagrlConfig):
    from transformers import AutoConfig

    from dagrl.backends.hf_model import resolve_model_path

    spec = critic_spec(cfg)
    return AutoConfig.from_pretrained(
        resolve_model_path(spec.model.path), trust_remote_code=spec.model.trust_remote_code
    )


def check_megatron_critic_plan(cfg: DagrlConfig, plan) -> None:
    """A critic sharing the megatron actor's workers runs in its parallel groups: same layout."""
    from dagrl.config.validate_critic import check_critic_plan

    check_critic_plan(cfg, plan)
    actor = cfg.actor_rollout_ref.actor
    shared = any({Role.train, Role.critic} <= set(g.roles) for g in plan.groups)
    if not shared or actor.strategy != "megatron":
        return
    for key in SHARED_LAYOUT:
        ours, theirs = getattr(cfg.critic.megatron, key), getattr(actor.megatron, key)
        if ours != theirs:
            raise ConfigError(
                f"{C}.{key}",
                ours,
                f"the critic is colocated with the megatron actor, whose {key} is {theirs}: megatron's"
                " parallel groups are per process, so use the same value, or give the critic its own"
                " devices (placement.colocate_groups without critic, placement.gpus.critic)",
            )


def critic_megatron(spec: RoleSpec) -> MegatronConfig:
    """critic.megatron with critic.model.gradient_checkpointing as megatron's full recompute (every
    layer, one per unit) unless critic.megatron.recompute_* are set, as the actor's."""
    m = spec.megatron
    if spec.train.update.model.gradient_checkpointing and m.recompute_granularity is None:
        m = replace(
            m,
            recompute_granularity=RecomputeGranularity.full,
            recompute_method=m.recompute_method or RecomputeMethod.uniform,
            recompute_num_layers=m.recompute_num_layers or 1,
        )
    return m
