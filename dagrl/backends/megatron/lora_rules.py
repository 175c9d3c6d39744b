"""The megatron backend's LoRA rules (actor_rollout_ref.model.lora_rank > 0), run with its other
rules before Ray starts: the target names are the decoder's linear layers (lora.py maps them onto
megatron's fused ones), and the layouts the adapters are built for."""

from __future__ import annotations

from dagrl.backends.megatron.lora import HF_LINEAR_NAMES, target_layers
from dagrl.config.roles import policy_lora
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError

M = "actor_rollout_ref.model"
A = "actor_rollout_ref.actor.megatron"


def check_megatron_lora(cfg: DagrlConfig, experts: int) -> None:
    """Targets are the model's dense linear layers; one pipeline stage; no routed experts
    (`experts`: the model's count)."""
    lora = policy_lora(cfg)
    if lora is None:
        return
    _, unknown = target_layers(lora.target_modules)
    if unknown:
        raise ConfigError(
            f"{M}.target_modules",
            cfg.actor_rollout_ref.model.target_modules,
            f"{list(unknown)} are not linear layers of the model; its linear layers are"
            f" {HF_LINEAR_NAMES} (or give all-linear; the output layer takes no adapter)",
        )
    m = cfg.actor_rollout_ref.actor.megatron
    if m.pipeline_model_parallel_size > 1:
        raise ConfigError(
            f"{A}.pipeline_model_parallel_size",
            m.pipeline_model_parallel_size,
            "LoRA on megatron runs on one pipeline stage (TP, SP, CP and DP split it): set 1, or"
            f" {M}.lora_rank=0",
        )
    if experts:
        raise ConfigError(
            f"{M}.lora_rank",
            lora.rank,
            f"LoRA on megatron adapts dense layers and this model routes {experts} experts: use"
            " actor_rollout_ref.actor.strategy=torch, or lora_rank=0",
        )
