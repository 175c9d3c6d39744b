"""The hf rollout's own rules, registered with it (dagrl/backends/builtin.py) and run by validate
when the rollout role uses it, before Ray starts."""

from __future__ import annotations

from dagrl.config.schema import DagrlConfig, LoraSync
from dagrl.console import log_once
from dagrl.errors import ConfigError


def check_hf_rollout(cfg: DagrlConfig) -> None:
    """One model per device: no tensor parallelism. On a GPU, a note that vLLM is the fast engine
    (hf is the CPU default; a verl command line without rollout.name lands here)."""
    r = cfg.actor_rollout_ref.rollout
    if cfg.trainer.device == "cuda":
        log_once(
            "note: actor_rollout_ref.rollout.name=hf on cuda: transformers' generate, padded batches "
            "without paged attention, many times slower than actor_rollout_ref.rollout.name=vllm"
        )
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
