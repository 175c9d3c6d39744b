"""ms-swift keys whose dagrl meaning depends on the rest of the config, resolved after composition.

`offload_model` is megatron's param/grad offload under `strategy=megatron` and the torch backend's
`actor.offload` otherwise; `beta` is the JSD mix under GKD and the KL-loss weight under GRPO;
`temperature` samples and, under GKD, also scales the divergence (ms-swift uses one temperature for
both); `global_batch_size` counts completions per optimizer step, so the prompts per mini-batch are
`global_batch_size / rollout.n` and a step samples `steps_per_generation` mini-batches.

A dagrl key given after one of these on the command line (or later in the file) wins over it.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from dagrl.errors import ConfigError

A = "actor_rollout_ref.actor"
DEFERRED = (
    "offload_model",
    "offload_optimizer",
    "beta",
    "temperature",
    "global_batch_size",
    "steps_per_generation",
)


def split_deferred(overrides: list[str]) -> tuple[list[str], list[tuple[int, str, object]]]:
    """(the other overrides, [(how many of them came before it, key, value)])."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dagrl.config.compat import parse_override

    parser, rest, deferred = OverridesParser.create(), [], []
    for text in overrides:
        key = text.split("=", 1)[0]
        if key in DEFERRED and "=" in text:
            deferred.append((len(rest), key, parse_override(parser, text).value()))
        else:
            rest.append(text)
    return rest, deferred


def apply_deferred(dcfg: DictConfig, deferred: list[tuple[int, str, object]], later_keys) -> None:
    """Set the dagrl keys each deferred ms-swift key stands for; `later_keys(i)` are the dagrl keys
    set by the overrides from position i on (those win)."""
    given = {key: value for _, key, value in deferred}
    for position, key, value in deferred:
        skip = later_keys(position)
        for target, target_value in _targets(dcfg, key, value, given):
            if target not in skip:
                OmegaConf.update(dcfg, target, target_value, merge=False)


def _targets(dcfg: DictConfig, key: str, value: object, given: dict) -> list[tuple[str, object]]:
    megatron = _name(dcfg.actor_rollout_ref.actor.strategy) == "megatron"
    distill = _name(dcfg.algorithm.name) in ("gkd", "opsd")
    if key == "offload_model":
        if megatron:
            return [(f"{A}.megatron.param_offload", value), (f"{A}.megatron.grad_offload", value)]
        return [(f"{A}.offload", value)]
    if key == "offload_optimizer":
        if megatron:
            return [(f"{A}.megatron.optimizer_offload", value)]
        other = given.get("offload_model", value)
        if other != value:
            raise ConfigError(
                key,
                value,
                f"the torch backend offloads weights and optimizer state together ({A}.offload), and"
                f" offload_model={other}: give both the same value, or use {A}.strategy=megatron",
            )
        return [(f"{A}.offload", value)]
    if key == "beta":
        if distill:
            return [("algorithm.gkd.beta", value)]
        return [(f"{A}.kl_loss_coef", value), (f"{A}.use_kl_loss", bool(value))]
    if key == "temperature":
        out = [("actor_rollout_ref.rollout.temperature", value)]
        return out + ([("algorithm.gkd.temperature", value)] if distill else [])
    return _batch_targets(dcfg, key, value, given)


def _batch_targets(dcfg: DictConfig, key: str, value: object, given: dict) -> list[tuple[str, object]]:
    n = int(dcfg.actor_rollout_ref.rollout.n)
    steps = given.get("steps_per_generation", 1)
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps_per_generation", steps, "a whole number of mini-batches per rollout (>= 1)")
    if key == "steps_per_generation":
        if "global_batch_size" in given:
            return []  # global_batch_size sets both keys
        mini = int(dcfg.actor_rollout_ref.actor.ppo_mini_batch_size)
        return [("data.train_batch_size", mini * steps)]
    if not isinstance(value, int) or value < 1 or value % n:
        raise ConfigError(
            key,
            value,
            f"ms-swift counts completions per optimizer step: give a multiple of num_generations"
            f" (actor_rollout_ref.rollout.n = {n})",
        )
    return [(f"{A}.ppo_mini_batch_size", value // n), ("data.train_batch_size", value // n * steps)]


def _name(value: object) -> str:
    return str(getattr(value, "value", value))
