"""The megatron train backend's part in the plan's automatic choices
(dagrl/backends/plan_hooks.py): the optimizer's place is `megatron.optimizer_cpu_offload`, state
stays on the device between phases (unless `megatron.*_offload` say otherwise), and
`model.gradient_checkpointing=true` means megatron's full recompute unless `recompute_*` are set."""

from __future__ import annotations

from dagrl.backends.megatron.rules import recompute_for_checkpointing
from dagrl.backends.plan_hooks import PlanHooks

A = "actor_rollout_ref.actor"


def _optimizer_host(cfg):
    return cfg.actor_rollout_ref.actor.megatron, f"{A}.megatron.optimizer_cpu_offload"


def _recompute_pinned(cfg) -> bool:
    return cfg.actor_rollout_ref.actor.megatron.recompute_granularity is not None


def _update_levers(spec) -> tuple[str | None, str | None]:
    m = spec.megatron
    recompute = f"{A}.megatron.recompute_granularity=full" if m.recompute_granularity is None else None
    optimizer = (
        None
        if m.optimizer_cpu_offload
        else f"the optimizer on the host ({A}.megatron.optimizer_cpu_offload=true)"
    )
    return recompute, optimizer


MEGATRON_PLAN_HOOKS = PlanHooks(
    optimizer_host=_optimizer_host,
    resident_between_phases=True,
    recompute_pinned=_recompute_pinned,
    enable_recompute=recompute_for_checkpointing,
    update_levers=_update_levers,
)
