"""The torch train backend's part in the plan's automatic choices (dagrl/backends/plan_hooks.py):
the optimizer's place is `actor.optimizer_cpu_offload`, recomputation is HF gradient
checkpointing, and `actor.offload` (params and optimizer state together) moves between phases."""

from __future__ import annotations

from dagrl.backends.plan_hooks import PlanHooks

A = "actor_rollout_ref.actor"


def _optimizer_host(cfg):
    return cfg.actor_rollout_ref.actor, f"{A}.optimizer_cpu_offload"


TORCH_PLAN_HOOKS = PlanHooks(optimizer_host=_optimizer_host, names_recompute_key=True, auto_offload=True)
