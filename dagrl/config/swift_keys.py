"""ms-swift keys whose dagrl meaning depends on the rest of the config, resolved after composition.

`offload_model` / `offload_optimizer` are the train backend's own offload keys (its hooks'
`swift_offload`: megatron's param/grad and optimizer offload, the torch backend's `actor.offload`); `beta` is the JSD mix under GKD and the KL-loss weight under GRPO;
`temperature` samples and, under GKD, also scales the divergence (ms-swift uses one temperature for
both); `global_batch_size` counts completions per optimizer step, so the prompts per mini-batch are
`global_batch_size / rollout.n` and a step samples `steps_per_generation` mini-batches.
`train_iters`, `save_steps` / `save_interval` and `eval_steps` / `eval_interval` count optimizer
steps, as in ms-swift's megatron trainer, where one generation feeds `steps_per_generation` of them;
dagrl counts steps of one rollout each, so they are divided by it (a count that is not a multiple
is refused). A save interval without an eval interval sets both, as ms-swift's `eval_steps` defaults
to `save_steps`.
`tuner_type: lora` turns LoRA on with ms-swift's defaults (rank 8, alpha 32, dropout 0.05) where
the LoRA keys are not given; `tuner_type: full` with a LoRA rank set is a contradiction, refused.

A dagrl key given after one of these on the command line (or later in the file) wins over it.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS

A = "actor_rollout_ref.actor"
M = "actor_rollout_ref.model"
TUNER_KEYS = ("tuner_type", "train.tuner_type")
SWIFT_LORA_DEFAULTS = {"lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05}
# ms-swift's optimizer-step counts and the dagrl keys (counting rollouts) they set
STEP_COUNTS = {
    "train_iters": "trainer.total_training_steps",
    "save_steps": "trainer.save_freq",
    "save_interval": "trainer.save_freq",  # ms-swift before 4.0 (Megatron-LM's name)
    "eval_steps": "trainer.test_freq",
    "eval_interval": "trainer.test_freq",
}
SAVE_KEYS = ("save_steps", "save_interval")
EVAL_KEYS = ("eval_steps", "eval_interval")
DEFERRED = (
    *TUNER_KEYS,
    "offload_model",
    "offload_optimizer",
    "beta",
    "temperature",
    "global_batch_size",
    "steps_per_generation",
    *STEP_COUNTS,
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
        # tuner_type fills ms-swift's LoRA defaults: a LoRA key given anywhere wins over them
        skip = later_keys(0) if key in TUNER_KEYS else later_keys(position)
        if key in TUNER_KEYS:
            _check_tuner(dcfg, key, value, skip)
        for target, target_value in _targets(dcfg, key, value, given):
            if target not in skip:
                OmegaConf.update(dcfg, target, target_value, merge=False)


def _targets(dcfg: DictConfig, key: str, value: object, given: dict) -> list[tuple[str, object]]:
    distill = _name(dcfg.algorithm.name) in ("gkd", "opsd")
    if key in TUNER_KEYS:
        if value == "full":
            return []
        return [(f"{M}.{k}", v) for k, v in SWIFT_LORA_DEFAULTS.items()]
    if key in ("offload_model", "offload_optimizer"):
        return _offload_targets(dcfg, key, value, given)
    if key == "beta":
        if distill:
            return [("algorithm.gkd.beta", value)]
        return [(f"{A}.kl_loss_coef", value), (f"{A}.use_kl_loss", bool(value))]
    if key == "temperature":
        out = [("actor_rollout_ref.rollout.temperature", value)]
        return out + ([("algorithm.gkd.temperature", value)] if distill else [])
    if key in STEP_COUNTS:
        return _step_count_targets(key, value, given)
    return _batch_targets(dcfg, key, value, given)


def _step_count_targets(key: str, value: object, given: dict) -> list[tuple[str, object]]:
    """An optimizer-step count as dagrl's steps: one rollout feeds `steps_per_generation` updates."""
    steps = _steps_per_generation(given)
    targets = [STEP_COUNTS[key]]
    if key == "train_iters" and value is None:
        return [(targets[0], None)]  # ms-swift's default: the epochs decide
    if key in SAVE_KEYS and not any(k in given for k in EVAL_KEYS):
        targets.append("trainer.test_freq")  # ms-swift evaluates at the save interval unless told
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        never = {"trainer.save_freq": "no checkpoints", "trainer.test_freq": "no validation"}.get(targets[0])
        extra = f" ({never}: {targets[0]}=-1)" if never else ""
        raise ConfigError(key, value, f"ms-swift counts optimizer steps: give a whole number >= 1{extra}")
    if value % steps:
        near = sorted({m for m in (value // steps * steps, (value // steps + 1) * steps) if m > 0})
        raise ConfigError(
            key,
            value,
            f"ms-swift counts optimizer steps and one rollout feeds steps_per_generation = {steps} of them:"
            f" give a multiple of {steps} (e.g. {' or '.join(map(str, near))}),"
            f" or dagrl's {targets[0]}, which counts rollouts",
        )
    return [(target, value // steps) for target in targets]


def _batch_targets(dcfg: DictConfig, key: str, value: object, given: dict) -> list[tuple[str, object]]:
    n = int(dcfg.actor_rollout_ref.rollout.n)
    steps = _steps_per_generation(given)
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


def _steps_per_generation(given: dict) -> int:
    steps = given.get("steps_per_generation", 1)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError("steps_per_generation", steps, "a whole number of mini-batches per rollout (>= 1)")
    return steps


def _check_tuner(dcfg: DictConfig, key: str, value: object, given: set[str]) -> None:
    """tuner_type is full or lora, and agrees with a LoRA rank given beside it."""
    rank = int(dcfg.actor_rollout_ref.model.lora_rank)
    if value not in ("full", "lora"):
        raise ConfigError(key, value, "dagrl trains full or lora (LoRA adapters)")
    if value == "full" and rank > 0:
        raise ConfigError(
            key,
            value,
            f"{M}.lora_rank = {rank} trains LoRA adapters: set tuner_type: lora, or remove lora_rank",
        )
    if value == "lora" and f"{M}.lora_rank" in given and rank <= 0:
        raise ConfigError(
            f"{M}.lora_rank", rank, "tuner_type: lora needs a rank > 0 (ms-swift's default is 8)"
        )


def _offload_targets(dcfg: DictConfig, key: str, value: object, given: dict) -> list[tuple[str, object]]:
    """ms-swift's offload_model / offload_optimizer as the train backend's own keys (its hooks'
    `swift_offload`); a backend moving both with one key takes one value for both."""
    strategy = _name(dcfg.actor_rollout_ref.actor.strategy)
    hooks = BACKENDS.backend(strategy).hooks
    keys = hooks.swift_offload if hooks is not None else {}
    if key not in keys:
        raise ConfigError(key, value, f"the {strategy} train backend has no offload key for it; remove it")
    other_key = "offload_model" if key == "offload_optimizer" else "offload_optimizer"
    shared = sorted(set(keys[key]) & set(keys.get(other_key, ())))
    other = given.get(other_key, value)
    if key == "offload_optimizer" and shared and other != value:
        separate = [n for n in BACKENDS.names("train") if _separate_offload(n)]
        raise ConfigError(
            key,
            value,
            f"the {strategy} backend offloads weights and optimizer state together ({', '.join(shared)}),"
            f" and {other_key}={other}: give both the same value"
            + (f", or use {A}.strategy={' or '.join(separate)}" if separate else ""),
        )
    return [(target, value) for target in keys[key]]


def _separate_offload(name: str) -> bool:
    keys = getattr(BACKENDS.backend(name).hooks, "swift_offload", None) or {}
    both = ("offload_model", "offload_optimizer")
    return all(k in keys for k in both) and not set(keys["offload_model"]) & set(keys["offload_optimizer"])


def _name(value: object) -> str:
    return str(getattr(value, "value", value))
