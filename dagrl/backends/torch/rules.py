"""The torch train backend's own rules, registered with it (dagrl/backends/builtin.py) and run
by validate when a role uses it, before Ray starts."""

from __future__ import annotations

from dagrl.config.schema import DagrlConfig, ModelDtype
from dagrl.errors import ConfigError

A = "actor_rollout_ref.actor"


def check_torch(cfg: DagrlConfig) -> None:
    """Packing only for models transformers implements itself; the precision it can honour.
    (Model-parallel and megatron optimizer knobs set for it are refused by the megatron backend's
    rules for when it is not chosen: backends/megatron/rules.py, check_megatron_unused.)"""
    _check_precision(cfg)
    model = cfg.actor_rollout_ref.model
    if model.use_remove_padding and model.trust_remote_code:
        # packing relies on transformers' own masks reading sequence starts from the position ids
        # (docs/packing.md); a repository's own modelling code may ignore them and mix sequences
        raise ConfigError(
            "actor_rollout_ref.model.use_remove_padding",
            True,
            "the torch backend packs for models transformers implements itself; with"
            " trust_remote_code=true set use_remove_padding=false (or use actor.strategy=megatron)",
        )
    if model.lora_rank > 0:
        check_lora_targets(cfg)


def check_lora_targets(cfg: DagrlConfig) -> None:
    """Every LoRA target is a linear layer of the model (read from its config on the meta device)."""
    from dagrl.backends.hf_model import resolve_model_path
    from dagrl.backends.torch.lora import model_linear_names, unknown_targets
    from dagrl.config.roles import policy_lora

    model = cfg.actor_rollout_ref.model
    names = model_linear_names(resolve_model_path(model.path), model.trust_remote_code)
    unknown = unknown_targets(policy_lora(cfg).target_modules, names)
    if unknown:
        raise ConfigError(
            "actor_rollout_ref.model.target_modules",
            model.target_modules,
            f"{unknown} are not linear layers of the model; its linear layers are {names} (or give"
            " all-linear; the output layer takes no adapter)",
        )


def _check_precision(cfg: DagrlConfig) -> None:
    """bf16/fp32 weights train (bf16 through fp32 master weights, mixed_precision.py); fp16 would
    need loss scaling, which this backend does not do."""
    arr = cfg.actor_rollout_ref
    if arr.model.dtype in (ModelDtype.float16, ModelDtype.fp16):
        raise ConfigError(
            "actor_rollout_ref.model.dtype",
            arr.model.dtype.value,
            "fp16 training needs loss scaling, which the torch backend does not do; use bfloat16 "
            f"(fp32 master weights keep small updates) or {A}.strategy=megatron (dynamic loss scaling)",
        )
