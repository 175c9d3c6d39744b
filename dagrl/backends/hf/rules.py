"""The hf rollout's own rules, registered with it (dagrl/backends/builtin.py) and run by validate
when the rollout role uses it, before Ray starts."""

from __future__ import annotations

from dagrl.config.schema import DagrlConfig, LoraSync
from dagrl.errors import ConfigError


def check_hf_rollout(cfg: DagrlConfig) -> None:
    """One model per device: no tensor parallelism."""
    r = cfg.actor_rollout_ref.rollout
    if r.tensor_model_parallel_size != 1:
        raise ConfigError(
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            r.tensor_model_parallel_size,
            "the hf rollout runs one model per device; use 1 (or rollout.name=vllm)",
        )
    if cfg.actor_rollout_ref.model.lora_rank > 0 and r.lora_sync == LoraSync.adapter:
        raise ConfigError(
            "actor_rollout_ref.rollout.lora_sync",
            "adapter",
            "the hf rollout does not serve LoRA adapters: use merged (or auto), or rollout.name=vllm",
        )
