"""The torch train backend's part in the plan's automatic choices (dagrl/backends/train_hooks.py):
the optimizer's place is `actor.optimizer_cpu_offload`, recomputation is HF gradient
checkpointing, and `actor.offload` (params and optimizer state together) moves between phases.
Data parallel only: no section or layout of its own; a LoRA actor's reference is its base."""

from __future__ import annotations

from dagrl.backends.train_hooks import TrainHooks

A = "actor_rollout_ref.actor"


def _optimizer_host(cfg):
    return cfg.actor_rollout_ref.actor, f"{A}.optimizer_cpu_offload"


TORCH_HOOKS = TrainHooks(
    optimizer_host=_optimizer_host,
    names_recompute_key=True,
    auto_offload=True,
    lora_reference_is_base=True,
    applies_lora=True,
    device_levers=f"offload ({A}.offload for torch)",
    host_levers=f"less offload ({A}.offload)",
    idle_levers=f"{A}.offload=true (torch)",
    # params and optimizer state move together under one key
    swift_offload={"offload_model": (f"{A}.offload",), "offload_optimizer": (f"{A}.offload",)},
)
