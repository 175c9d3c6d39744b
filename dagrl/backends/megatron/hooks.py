"""The megatron train backend's part in the plan's automatic choices
(dagrl/backends/train_hooks.py): the optimizer's place is `megatron.optimizer_cpu_offload`, state
stays on the device between phases (unless `megatron.*_offload` say otherwise), and
`model.gradient_checkpointing=true` means megatron's full recompute unless `recompute_*` are set."""

from __future__ import annotations

from dagrl.backends.megatron.rules import recompute_for_checkpointing
from dagrl.backends.train_hooks import TrainHooks
from dagrl.config.roles import OffloadPolicy, ParallelLayout, dtype_name

A = "actor_rollout_ref.actor"


def _optimizer_host(cfg):
    return cfg.actor_rollout_ref.actor.megatron, f"{A}.megatron.optimizer_cpu_offload"


def _optimizer_host_blocked(cfg):
    """megatron-core runs its CPU optimizer inside the distributed optimizer only (precision_rules.py)."""
    m = cfg.actor_rollout_ref.actor.megatron
    return None if m.use_distributed_optimizer else (f"{A}.megatron.use_distributed_optimizer", False)


def _optimizer_share(cfg):
    return cfg.actor_rollout_ref.actor.megatron, f"{A}.megatron.optimizer_offload_fraction"


def _recompute_pinned(cfg) -> bool:
    return cfg.actor_rollout_ref.actor.megatron.recompute_granularity is not None


def _update_levers(spec) -> tuple[str | None, str | None]:
    m = spec.megatron
    recompute = f"{A}.megatron.recompute_granularity=full" if m.recompute_granularity is None else None
    host = f"{A}.megatron.optimizer_cpu_offload=true"
    if not m.use_distributed_optimizer:
        host += f" with {A}.megatron.use_distributed_optimizer=true"
    optimizer = None if m.optimizer_cpu_offload else f"the optimizer on the host ({host})"
    return recompute, optimizer


def _layout(m) -> ParallelLayout:
    return ParallelLayout(
        m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size
    )


def _offload(cfg, m) -> OffloadPolicy:
    """megatron's three switches (grad_offload auto = on)."""
    return OffloadPolicy(m.param_offload, m.grad_offload is not False, m.optimizer_offload)


def _compute_dtype(cfg) -> str:
    """megatron.param_dtype: a siiRL script with param_dtype=bfloat16 samples in bf16, not in
    model.dtype's fp32."""
    return dtype_name(cfg.actor_rollout_ref.actor.megatron.param_dtype)


MEGATRON_HOOKS = TrainHooks(
    layout=_layout,
    offload=_offload,
    compute_dtype=_compute_dtype,
    optimizer_host=_optimizer_host,
    optimizer_host_blocked=_optimizer_host_blocked,
    resident_between_phases=True,
    recompute_pinned=_recompute_pinned,
    enable_recompute=recompute_for_checkpointing,
    update_levers=_update_levers,
    lora_reference_is_base=True,  # megatron LoRA: the adapters switched off (lora.py)
    optimizer_share=_optimizer_share,
    applies_lora=True,
    device_levers=(
        f"tensor/pipeline parallel ({A}.strategy=megatron, megatron.tensor_model_parallel_size / "
        "pipeline_model_parallel_size), offload (megatron.param_offload / optimizer_offload), the "
        "distributed optimizer (megatron.use_distributed_optimizer=true)"
    ),
    host_levers=(
        f"megatron's CPU optimizer ({A}.strategy=megatron: 12 bytes per parameter on the host, the "
        f"torch backend's 16), a smaller share of megatron's CPU optimizer "
        f"({A}.megatron.optimizer_offload_fraction), more GPUs (tensor/pipeline parallel shard both), "
        "less offload (megatron.*_offload)"
    ),
    idle_levers=(
        f"{A}.megatron.param_offload / grad_offload / optimizer_offload (a megatron critic: "
        "critic.megatron.param_offload / optimizer_offload)"
    ),
    swift_offload={
        "offload_model": (f"{A}.megatron.param_offload", f"{A}.megatron.grad_offload"),
        "offload_optimizer": (f"{A}.megatron.optimizer_offload",),
    },
)
