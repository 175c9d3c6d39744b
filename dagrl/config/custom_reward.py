"""verl's `custom_reward_function` section as dagrl's: one reward term and one plugin file.

verl loads the function `name` (default `compute_score`) from the file at `path` and calls it with
`reward_kwargs` bound on every call. The three keys make one thing, so they are translated together,
before the table of single keys (dagrl/config/compat.py):

- `path` joins `external_plugins` (after the entries given there), which makes the file's functions
  findable by name;
- `name` and `reward_kwargs.*` become `reward.functions=[{name: ..., weight: 1.0, kwargs: {...}}]`.

The function is then called by keyword as verl calls it (dagrl/rewards/registry.py `reward_form`).
"""

from __future__ import annotations

import difflib

from dagrl.config import override_values
from dagrl.config.override_text import render_value
from dagrl.errors import ConfigError

SECTION = "custom_reward_function"
VERL_DEFAULT_NAME = "compute_score"  # verl's default for custom_reward_function.name


def translate_custom_reward(parser, overrides: list[str]) -> list[str]:
    """`overrides` with the custom_reward_function.* entries replaced by dagrl's reward term and
    plugin entry (in place of the first of them); the others as they are."""
    section, rest, at = {}, [], None
    for text in overrides:
        key = text.partition("=")[0].lstrip("+~")
        if key != SECTION and not key.startswith(SECTION + "."):
            rest.append(text)
            continue
        at = len(rest) if at is None else at
        section[key] = override_values.parse(parser, text)[0].value()
    if at is None:
        return overrides
    path, names, kwargs = _read(section)
    if not names:  # verl's path=null alone: no custom reward
        return rest
    terms = [{"name": name, "weight": 1.0, "kwargs": kwargs} for name in names]
    if any(t.partition("=")[0].lstrip("+~") == "reward.functions" for t in rest):
        raise ConfigError(
            SECTION,
            section,
            "reward.functions is given too: name every reward there (reward.functions=[{name: ...,"
            " kwargs: {...}}]) with the file in external_plugins, or use custom_reward_function alone",
        )
    added = [f"reward.functions={render_value(terms)}"]
    if path is not None:
        rest = _with_plugin(parser, rest, path)
    return rest[:at] + added + rest[at:]


def _read(section: dict) -> tuple[str | None, list[str], dict]:
    """(path or None, function names, reward kwargs) from the section's overrides; no names when
    nothing asks for a custom reward (verl's path=null)."""
    whole = section.pop(SECTION, None) or {}
    if not isinstance(whole, dict):
        raise ConfigError(SECTION, whole, "give its keys: custom_reward_function.path=... .name=...")
    entries = {f"{SECTION}.{k}": v for k, v in whole.items()}
    entries.update(section)
    path, name, kwargs = None, None, {}
    for key, value in entries.items():
        field = key[len(SECTION) + 1 :]
        if field == "path":
            path = value
        elif field == "name":
            name = value
        elif field == "reward_kwargs":
            if not isinstance(value, dict):
                raise ConfigError(key, value, "give a mapping: reward_kwargs.<keyword>=<value>")
            kwargs.update(value)
        elif field.startswith("reward_kwargs."):
            kwargs[field.removeprefix("reward_kwargs.")] = value
        else:
            near = difflib.get_close_matches(field, ("path", "name", "reward_kwargs"), n=1)
            hint = f"did you mean {SECTION}.{near[0]}? " if near else ""
            raise ConfigError(
                key, value, f"{hint}verl's {SECTION} has path, name and reward_kwargs.<keyword>"
            )
    path = None if path in (None, "") else str(path)
    if name is None:  # verl's default name, unless nothing asks for a custom reward (path=null)
        name = VERL_DEFAULT_NAME if path is not None or kwargs else []
    names = name if isinstance(name, list) else [name]
    return path, [str(n) for n in names], kwargs


def _with_plugin(parser, overrides: list[str], path: str) -> list[str]:
    """`path` appended to the external_plugins the overrides give (one file or a list; the last
    such override is the one that counts), or added."""
    for i in reversed(range(len(overrides))):
        key = overrides[i].partition("=")[0]
        if key.lstrip("+~") == "external_plugins" and not key.startswith("~"):
            value = override_values.parse(parser, overrides[i])[0].value()
            plugins = list(value) if isinstance(value, list) else [] if value is None else [value]
            return [*overrides[:i], f"external_plugins={render_value([*plugins, path])}", *overrides[i + 1 :]]
    return [*overrides, f"external_plugins={render_value([path])}"]
