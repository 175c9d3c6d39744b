"""LoRA's rules that need only the config (actor_rollout_ref.model.lora_*); the backends add
theirs (target names against the model's layers; the rollout engines: what they can serve)."""

from __future__ import annotations

from dagrl.config.roles import ALL_LINEAR
from dagrl.config.schema import DagrlConfig, LoraSync, ModelConfig
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS

M = "actor_rollout_ref.model"
LORA_KEYS = ("lora_alpha", "target_modules", "lora_dropout")  # what a rank of 0 leaves unused


def check_lora(cfg: DagrlConfig) -> None:
    """target_modules is a name or a list of names; LoRA's other keys need lora_rank > 0 (set
    without it they would do nothing)."""
    m = cfg.actor_rollout_ref.model
    targets = m.target_modules
    names = [targets] if isinstance(targets, str) else targets
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(t, str) and t for t in names):
        raise ConfigError(
            f"{M}.target_modules",
            targets,
            f"give {ALL_LINEAR} or a list of module names, e.g. [q_proj,v_proj]",
        )
    if m.lora_rank > 0:
        _check_train_backend(cfg)
        return
    defaults, r = ModelConfig(), cfg.actor_rollout_ref.rollout
    given = {f"{M}.{k}": getattr(m, k) for k in LORA_KEYS if getattr(m, k) != getattr(defaults, k)}
    if r.lora_sync != LoraSync.auto:
        given["actor_rollout_ref.rollout.lora_sync"] = r.lora_sync.value
    for key, value in given.items():
        raise ConfigError(
            key, value, f"LoRA is off ({M}.lora_rank = 0): set lora_rank > 0 (e.g. 8), or remove the key"
        )


def _check_train_backend(cfg: DagrlConfig) -> None:
    """LoRA is built into the train backends whose hooks say so (`applies_lora`); any other would
    train every weight instead."""
    strategy = cfg.actor_rollout_ref.actor.strategy
    if _applies_lora(strategy):
        return
    able = sorted(name for name in BACKENDS.names("train") if _applies_lora(name))
    raise ConfigError(
        f"{M}.lora_rank",
        cfg.actor_rollout_ref.model.lora_rank,
        f"the {strategy} train backend does not apply LoRA; use actor_rollout_ref.actor.strategy="
        + " or ".join(able),
    )


def _applies_lora(name: str) -> bool:
    hooks = BACKENDS.backend(name).hooks
    return hooks is not None and hooks.applies_lora
