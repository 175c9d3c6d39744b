"""The megatron train backend's rules of mixed precision and optimizer CPU offload, checked
before Ray starts (run by its registered rules, dagrl/backends/megatron/rules.py: check_megatron,
and the megatron critic's, critic_rules.py: check_megatron_critic).

The optimizer's CPU offload is `actor.megatron.optimizer_cpu_offload` (with megatron-core's
fraction / overlap / precision-aware knobs) here and `actor.optimizer_cpu_offload` on the torch
backend (backends/torch/rules.py); each is refused on the other backend, naming the key that does
it there. The megatron critic builds its optimizer from `critic.megatron.*` as the actor does from
its section, under the same rules. The reference model is forward-only, so optimizer knobs on
ref.megatron are refused.
"""

from __future__ import annotations

from dagrl.backends.megatron import probes
from dagrl.config.schema import DagrlConfig, MegatronConfig
from dagrl.errors import ConfigError

A = "actor_rollout_ref.actor"
MEGATRON_OPTIMIZER_KNOBS = (
    "optimizer_cpu_offload",
    "optimizer_offload_fraction",
    "overlap_cpu_optimizer_d2h_h2d",
    "use_precision_aware_optimizer",
)


def changed_optimizer_knobs(m: MegatronConfig) -> list[str]:
    default = MegatronConfig()
    # an auto knob (null) pinned off tunes nothing
    return [
        k
        for k in MEGATRON_OPTIMIZER_KNOBS
        if getattr(m, k) != getattr(default, k)
        and not (getattr(default, k) is None and getattr(m, k) is False)
    ]


def check_ref_has_no_optimizer(cfg: DagrlConfig) -> None:
    """The reference model is forward-only: megatron's optimizer knobs on ref.megatron are refused
    (whichever train backend runs)."""
    m = cfg.actor_rollout_ref.ref.megatron
    for key in changed_optimizer_knobs(m):
        raise ConfigError(
            f"actor_rollout_ref.ref.megatron.{key}",
            getattr(m, key),
            f"the reference model is forward-only (no optimizer); set it on {A}.megatron.{key}",
        )


def check_megatron_precision(cfg: DagrlConfig) -> None:
    """The megatron train backend's precision and optimizer-offload rules."""
    check_ref_has_no_optimizer(cfg)
    actor = cfg.actor_rollout_ref.actor
    prefix = f"{A}.megatron"
    if actor.optimizer_cpu_offload:
        raise ConfigError(
            f"{A}.optimizer_cpu_offload",
            True,
            f"that is the torch backend's key; with strategy=megatron use {prefix}.optimizer_cpu_offload=true",
        )
    check_optimizer_section(prefix, actor.megatron, runs_on_cpu(cfg))


def check_optimizer_section(prefix: str, m: MegatronConfig, on_cpu: bool) -> None:
    """The optimizer knobs of a megatron section that trains (`prefix`: its full key, the actor's
    or the critic's), as megatron-core 0.16.1 can build and step them."""
    if not m.optimizer_cpu_offload:
        for key in ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"):
            if key in changed_optimizer_knobs(m):
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
        if not probes.transformer_engine_available():
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
    if m.optimizer_cpu_offload and on_cpu:
        raise ConfigError(
            f"{prefix}.optimizer_cpu_offload",
            True,
            "megatron's hybrid CPU optimizer copies between a CUDA device and the host; on "
            "trainer.device=cpu the optimizer already runs on the CPU: leave it false",
        )
    if m.optimizer_cpu_offload and not m.use_distributed_optimizer:
        # megatron-core 0.16.1 builds the CPU optimizer over a 16-bit model's parameters, then
        # Float16OptimizerWithFloat16Params swaps its own fp32 copies into that optimizer's groups:
        # the step looks them up in its maps (KeyError), and they would never get the gradients it
        # reads. fp32 parameters are not swapped (FP32Optimizer), but Megatron-LM never runs that
        # either (its CPU offload asks for the precision-aware, hence distributed, optimizer).
        raise ConfigError(
            f"{prefix}.optimizer_cpu_offload",
            True,
            "megatron-core 0.16.1 runs its CPU optimizer inside the distributed optimizer only (without "
            "it a bf16/fp16 model fails its first step: KeyError on the fp32 copies megatron swaps into "
            f"the CPU optimizer's groups): set {prefix}.use_distributed_optimizer=true (at DP 1 it shards "
            "nothing), or leave optimizer_cpu_offload false",
        )


def runs_on_cpu(cfg: DagrlConfig) -> bool:
    from dagrl.config.validate import resolve_device

    return resolve_device(cfg) == "cpu"
