"""Rules of mixed precision and optimizer CPU offload, per train backend, checked before Ray starts.

torch: bf16/fp32 weights train (bf16 through fp32 master weights, backends/torch/mixed_precision.py);
fp16 would need loss scaling, which the torch backend does not do, so it is refused. The optimizer's
CPU offload is `actor.optimizer_cpu_offload` there and `actor.megatron.optimizer_cpu_offload` (with
megatron-core's fraction / overlap / precision-aware knobs) on megatron; each is refused on the
other backend, naming the key that does it there.
"""

from __future__ import annotations

from dagrl.config.schema import DagrlConfig, MegatronConfig, ModelDtype
from dagrl.errors import ConfigError

A = "actor_rollout_ref.actor"
MEGATRON_OPTIMIZER_KNOBS = (
    "optimizer_cpu_offload",
    "optimizer_offload_fraction",
    "overlap_cpu_optimizer_d2h_h2d",
    "use_precision_aware_optimizer",
)


def check_precision(cfg: DagrlConfig) -> None:
    """The dtype and optimizer-offload settings the chosen strategy can honour."""
    arr = cfg.actor_rollout_ref
    _check_ref_has_no_optimizer(arr.ref.megatron)
    if arr.actor.strategy == "torch":
        _check_torch(cfg)
    else:
        _check_megatron(cfg)


def _changed(m: MegatronConfig) -> list[str]:
    default = MegatronConfig()
    return [k for k in MEGATRON_OPTIMIZER_KNOBS if getattr(m, k) != getattr(default, k)]


def _check_ref_has_no_optimizer(m: MegatronConfig) -> None:
    for key in _changed(m):
        raise ConfigError(
            f"actor_rollout_ref.ref.megatron.{key}",
            getattr(m, key),
            f"the reference model is forward-only (no optimizer); set it on {A}.megatron.{key}",
        )


def _check_torch(cfg: DagrlConfig) -> None:
    arr = cfg.actor_rollout_ref
    if arr.model.dtype in (ModelDtype.float16, ModelDtype.fp16):
        raise ConfigError(
            "actor_rollout_ref.model.dtype",
            arr.model.dtype.value,
            "fp16 training needs loss scaling, which the torch backend does not do; use bfloat16 "
            f"(fp32 master weights keep small updates) or {A}.strategy=megatron (dynamic loss scaling)",
        )
    for key in _changed(arr.actor.megatron):
        raise ConfigError(
            f"{A}.megatron.{key}",
            getattr(arr.actor.megatron, key),
            f"megatron's optimizer setting needs {A}.strategy=megatron; the torch backend's optimizer "
            f"CPU offload is {A}.optimizer_cpu_offload=true",
        )


def _check_megatron(cfg: DagrlConfig) -> None:
    actor = cfg.actor_rollout_ref.actor
    m, prefix = actor.megatron, f"{A}.megatron"
    if actor.optimizer_cpu_offload:
        raise ConfigError(
            f"{A}.optimizer_cpu_offload",
            True,
            f"that is the torch backend's key; with strategy=megatron use {prefix}.optimizer_cpu_offload=true",
        )
    if not m.optimizer_cpu_offload:
        for key in ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"):
            if key in _changed(m):
                raise ConfigError(
                    f"{prefix}.{key}",
                    getattr(m, key),
                    f"it tunes the optimizer's CPU offload: set {prefix}.optimizer_cpu_offload=true too",
                )
    elif m.optimizer_offload:
        raise ConfigError(
            f"{prefix}.optimizer_offload",
            True,
            f"with {prefix}.optimizer_cpu_offload=true the optimizer state already lives in host memory"
            " (moving it again between phases would put it on the device); leave optimizer_offload false",
        )
    if m.use_precision_aware_optimizer and not m.optimizer_cpu_offload:
        from dagrl.backends.megatron.rules import transformer_engine_available

        if not transformer_engine_available():
            raise ConfigError(
                f"{prefix}.use_precision_aware_optimizer",
                True,
                "on the device it needs TransformerEngine's FusedAdam, which is not installed; use it "
                f"with {prefix}.optimizer_cpu_offload=true (the CPU optimizer keeps the masters), or "
                "leave it false",
            )
    if m.use_precision_aware_optimizer and not m.use_distributed_optimizer:
        raise ConfigError(
            f"{prefix}.use_precision_aware_optimizer",
            True,
            f"megatron-core keeps precision-aware state only in the distributed optimizer: set "
            f"{prefix}.use_distributed_optimizer=true",
        )
    if m.optimizer_cpu_offload and _runs_on_cpu(cfg):
        raise ConfigError(
            f"{prefix}.optimizer_cpu_offload",
            True,
            "megatron's hybrid CPU optimizer copies between a CUDA device and the host; on "
            "trainer.device=cpu the optimizer already runs on the CPU: leave it false",
        )


def _runs_on_cpu(cfg: DagrlConfig) -> bool:
    from dagrl.config.validate import resolve_device

    return resolve_device(cfg) == "cpu"
