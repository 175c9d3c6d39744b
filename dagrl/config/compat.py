"""Keys of verl, siiRL and ms-swift, applied to the raw command-line overrides before the schema merge.

The table (dagrl/config/compat_table.py, rendered for users in docs/compat.md) says for each
foreign key whether it is an `Alias` of a dagrl key (rewritten here), a setting dagrl implements
one value of (`OnlyValue`), a concept dagrl does not have (`Unsupported`: refused naming what
dagrl offers instead), or a knob with no effect here (`NoEffect`: accepted with a note).

ms-swift keys whose dagrl meaning depends on the composed config (the train strategy, the algorithm,
rollout.n) are resolved after composition by dagrl/config/swift_keys.py (`offload_model`, `beta`,
`temperature`, `global_batch_size`, ...).

Keys dagrl already has under the same name and meaning need no entry: they reach the schema as they are.
"""

from __future__ import annotations

from dagrl.config.compat_table import (  # noqa: F401  (re-exported: the table's users import them here)
    CONFIG_NAMES,
    LORA_KEYS,
    TABLE,
    Alias,
    NoEffect,
    OnlyValue,
    Unsupported,
)
from dagrl.config.custom_reward import translate_custom_reward
from dagrl.config.override_text import render_key, render_value
from dagrl.errors import ConfigError


def lookup(key: str) -> tuple[str, Alias | OnlyValue | Unsupported] | None:
    """The table entry for `key`: its own, or that of the longest listed prefix (a whole section)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in TABLE:
            return prefix, TABLE[prefix]
    return None


def translate(overrides: list[str], notes: bool = True) -> list[str]:
    """Overrides with every foreign key rewritten to dagrl's; refused keys raise ConfigError.

    `trainer.total_epochs` given without `trainer.total_training_steps` also sets the latter to null,
    so that epochs decide as in verl even though dagrl's default job (conf/config.yaml) stops at 40.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dagrl.config import override_values

    parser = OverridesParser.create()
    out = []
    # verl's custom_reward_function.{path,name,reward_kwargs} make one reward term together
    for text in translate_custom_reward(parser, [json_override(t) for t in overrides]):
        try:
            override, text = override_values.parse(parser, text)  # unreadable values: one line
        except ConfigError:
            _refuse_unsupported(text)  # a refused key is refused for itself, whatever its value
            raise
        key = override.key_or_group
        found = None if override.is_delete() else lookup(key)
        if found is None:
            out.append(text)
            continue
        prefix, rule = found
        value = override.value()
        if isinstance(rule, Unsupported):
            raise ConfigError(key, value, f"not a dagrl setting: {rule.fix}")
        if isinstance(rule, NoEffect):
            from dagrl.console import log

            if notes:
                log(f"note: {key} has no effect: {rule.why}")
            continue
        if isinstance(rule, OnlyValue):
            if value not in rule.accepted:
                ok = " or ".join(str(v) for v in rule.accepted)
                raise ConfigError(key, value, f"dagrl supports only {ok} here: {rule.fix}")
            continue  # asks for what dagrl does anyway
        target = rule.target + key[len(prefix) :]
        raw = text.split("=", 1)[1]
        try:
            if rule.entries:  # entries of an open mapping: Hydra refuses a whole dict assigned to it
                out += [f"{target}.{render_key(k)}={render_value(v)}" for k, v in _as_mapping(value).items()]
            else:
                out.append(f"{target}={rule.convert(value) if rule.convert else raw}")
        except ValueError as exc:
            raise ConfigError(key, value, str(exc)) from None
    keys = {parser.parse_override(o).key_or_group for o in out}
    if "trainer.total_epochs" in keys and "trainer.total_training_steps" not in keys:
        out.append("trainer.total_training_steps=null")
    return out


def _as_mapping(value: object) -> dict:
    """Engine kwargs given as a JSON string (ms-swift's CLI form) or a mapping."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, dict):
        raise ValueError('give a mapping, e.g. {"max_logprobs": 64}')
    return value


def parse_override(parser, text: str):
    """Hydra's parse of one override; a value it cannot read is a ConfigError naming the key (a
    refused key is refused for itself first)."""
    from hydra.errors import HydraException

    try:
        return parser.parse_override(text)
    except HydraException as exc:
        key, _, raw = text.partition("=")
        found = lookup(key.lstrip("+~"))
        if found is not None and isinstance(found[1], Unsupported):
            raise ConfigError(key, raw, f"not a dagrl setting: {found[1].fix}") from None
        reason = str(exc).strip().splitlines()[0]
        raise ConfigError(key, raw, f"the value cannot be read ({reason}); quote it: {key}='...'") from None


def _refuse_unsupported(text: str) -> None:
    key, _, raw = text.partition("=")
    found = lookup(key.lstrip("+~"))
    if found is not None and isinstance(found[1], Unsupported):
        raise ConfigError(key, raw, f"not a dagrl setting: {found[1].fix}")


def json_override(text: str) -> str:
    """`key={"a": 1}` (JSON, as ms-swift's CLI takes engine kwargs and device_groups) rewritten in
    Hydra's syntax; any other text is returned as it is."""
    import json

    key, eq, raw = text.partition("=")
    if not eq or not raw.lstrip().startswith(("{", "[")) or '"' not in raw:
        return text
    try:
        return f"{key}={render_value(json.loads(raw))}"
    except (json.JSONDecodeError, ValueError):
        return text


def config_name_overrides(name: str) -> list[str]:
    """`--config-name <verl root config>` as overrides; another name is refused."""
    stem = name.removesuffix(".yaml")
    if stem not in CONFIG_NAMES:
        raise ConfigError(
            "--config-name",
            name,
            f"dagrl has one root config; accepted for verl scripts: {', '.join(CONFIG_NAMES)}",
        )
    return list(CONFIG_NAMES[stem])
