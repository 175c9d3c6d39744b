"""Override values Hydra's grammar cannot read, and Hydra's composition failures, as one line each.

Hydra reads `key=value` with its own grammar: `=`, `[`, `]`, `{`, `}`, a leading `~`, quotes and
`\\` mean something in an unquoted value, and a comma makes a sweep (several runs). A value holding
them is quoted, as Hydra documents: `'trainer.default_local_dir="/runs/lr=1e-6"'` (the single
quotes are the shell's, the double ones Hydra's).

One unquoted case is taken as it is, because it is how run directories are commonly named and its
meaning is plain. The rule, exactly (`plain_path`): Hydra cannot parse the override; it is
`key=value` or `+key=value` with a key of the schema whose type is a string (`str`, `str|null`,
`any|null`: the path-valued keys among them); the value starts with `/`, `~`, `./` or `../`; and
it has none of `'`, `"`, `\\`, `$`, `,` nor a control character, and no leading or trailing blank.
Such an override is passed on with the value in single quotes, unchanged. Everything else that
Hydra cannot parse is a ConfigError naming the key and the value and showing the quoted form.

A key holding a list of names (`trainer.logger`, `external_plugins`) takes one name alone as a list
of one (`trainer.logger=console`, as verl accepts it); an error about any list-valued key shows the
list form (`'placement.colocate_groups=[[train,rollout,ref]]'`), never a quoted string.
"""

from __future__ import annotations

import difflib
import re

from dagrl.config import keys
from dagrl.config.override_text import render_value
from dagrl.errors import ConfigError

PATH_TYPES = frozenset({"str", "str|null", "any", "any|null"})
PATH_STARTS = ("/", "~", "./", "../")
_NOT_IN_PLAIN_PATH = re.compile(r"['\"\\$,\x00-\x1f\x7f]")


def parse(parser, text: str):
    """(Hydra's Override, the text to compose with) for one command-line override; ConfigError
    when Hydra cannot read it, or when an unquoted comma turned it into a sweep."""
    from hydra.errors import HydraException

    try:
        override = parser.parse_override(text)
    except HydraException as exc:
        quoted = plain_path(text)
        if quoted is None:
            raise _unreadable(text, exc) from None
        return parser.parse_override(quoted), quoted
    if override.is_sweep_override():
        key, _, value = text.partition("=")
        info = keys.schema_keys().get(key.lstrip("+"))
        listed = f"give a list: '{key}=[{value}]'"
        if info is not None and info.type.startswith("list"):  # quoted, it would be one string
            fix = listed
        else:
            may_list = info is None or info.type in ("any", "any|null")
            fix = f"quote the value: '{key}=\"{value}\"'" + (f", or {listed}" if may_list else "")
        raise ConfigError(
            key.lstrip("+"), value, f"an unquoted comma makes Hydra read several values (a sweep); {fix}"
        )
    return _one_name_as_list(parser, override, text)


def _one_name_as_list(parser, override, text: str):
    """`trainer.logger=console` as `trainer.logger=[console]`: a key holding a list of names takes
    one name alone too (verl's Tracking accepts a string logger)."""
    info = keys.schema_keys().get(override.key_or_group.lstrip("+"))
    value = None if override.is_delete() else override.value()
    if info is None or not info.names or not isinstance(value, str) or "${" in value:
        return override, text
    listed = f"{text.partition('=')[0]}=[{render_value(value)}]"
    return parser.parse_override(listed), listed


def plain_path(text: str) -> str | None:
    """`key='value'` when `text` is an unquoted path for a string key (the rule in the module
    docstring), else None."""
    key, sep, value = text.partition("=")
    info = keys.schema_keys().get(key.removeprefix("+"))
    if not sep or info is None or info.type not in PATH_TYPES:
        return None
    if not value.startswith(PATH_STARTS) or value != value.strip() or _NOT_IN_PLAIN_PATH.search(value):
        return None
    return f"{key}='{value}'"


def _unreadable(text: str, exc: Exception) -> ConfigError:
    key, sep, value = text.partition("=")
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not sep:
        return ConfigError("command line", text, f"Hydra cannot read it ({reason}); overrides are key=value")
    info = keys.schema_keys().get(key.lstrip("+~"))
    if info is not None and info.type not in PATH_TYPES:
        return ConfigError(
            key.lstrip("+~"), value, f"Hydra cannot read this value ({reason}); it takes {info.type}"
        )
    escaped = value.replace('"', '\\"')  # Hydra: a backslash is special only before a quote
    return ConfigError(
        key.lstrip("+~"),
        value,
        f"Hydra cannot read this value ({reason}); quote it: '{key}=\"{escaped}\"'"
        " (the single quotes keep the shell from removing the double ones)",
    )


def composition_error(exc: Exception, overrides: list[str], groups: dict[str, list[str]]) -> ConfigError:
    """Hydra's multi-line composition failure as one ConfigError naming the full key path (inside
    list and dict values too: `reward.functions[0].weight`), the value and the nearest valid one."""
    cause = exc.__cause__ or exc
    full_key = getattr(cause, "full_key", None)
    full_key = "" if full_key is None else str(full_key)  # 0: the first item of a list
    value = getattr(cause, "value", None)
    reason = str(cause).strip().splitlines()[0]
    text = next((o for o in overrides if full_key and _key_of(o) == full_key), None)
    key = full_key
    merging = _MERGING.search(str(exc))
    if full_key.isdigit() and merging:  # an item of a list of lists: OmegaConf names its index only
        text = merging.group(1)
        key, value = f"{_key_of(text)}[{full_key}]", _item(text, int(full_key))
    elif text is None and full_key:  # a key inside an override's list or dict value
        key, value = _inside_values(overrides, full_key, value)
    if not key:  # a config group option that does not exist (algorithm=foo)
        text = next((o for o in overrides if _key_of(o) in str(cause)), "")
        key = _key_of(text)
    if text is not None and "=" in text and value is None:
        value = text.split("=", 1)[1]
    if key in groups:
        near = difflib.get_close_matches(str(value), groups[key], n=1, cutoff=0.6)
        hint = f"did you mean '{near[0]}'? " if near else ""
        return ConfigError(key, value, f"no such preset; {hint}options: {', '.join(groups[key])}")
    if _NOT_A_LIST in reason and key:
        return ConfigError(key, value, f"takes a list: {_list_form(key.split('[')[0], value)}")
    return ConfigError(key or "command line", value, _fix(reason, cause))


def _item(text: str, index: int):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    items = OverridesParser.create().parse_override(text).value()
    return items[index] if isinstance(items, list) and index < len(items) else None


def _list_form(key: str, value: object) -> str:
    """`'key=[...]'` for a list-valued key: the schema's default when it has one, else `value` as
    the list's one item (a mapping naming it, for a list of sections: `[{name: arith}]`)."""
    info = keys.schema_keys().get(key)
    if info is not None and info.default:
        return f"'{key}={_plain(info.default)}'"
    item_type = info.type.removeprefix("list[").removesuffix("]") if info is not None else ""
    fields = _fields_of(item_type)
    item = f"{{{fields[0]}: {_plain(value)}}}" if fields else _plain(value)
    return f"'{key}=[{item}]'"


def _plain(value: object) -> str:
    """A value as a user types it in an override: `[[train,rollout,ref]]`, `[0.9,0.999]`."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_plain(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_plain(v)}" for k, v in value.items()) + "}"
    return str(value)


def _key_of(override: str) -> str:
    return override.lstrip("+~").split("=")[0]


def _inside_values(overrides: list[str], leaf: str, value) -> tuple[str, object]:
    """(full key path, value) of `leaf` (OmegaConf's key inside a list element, e.g. `weight`) in
    the list/dict value of one of `overrides`; the leaf itself when none holds it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in overrides:
        try:
            parsed = parser.parse_override(text)
        except Exception:  # already parsed once; a value this cannot read holds nothing here
            continue
        found = _find(parsed.value(), leaf.rsplit(".", 1)[-1], value)
        if found is not None:
            return parsed.key_or_group + found[0], found[1]
    return leaf, value


def _find(node, leaf: str, value, path: str = "") -> tuple[str, object] | None:
    """(path, value) under `node` (`[0].weight`) of the entry `leaf` holding `value` (any value
    when `value` is None: an unknown key)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if str(k) == leaf and (value is None or v == value or str(v) == str(value)):
                return f"{path}.{k}", v
            found = _find(v, leaf, value, f"{path}.{k}")
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found = _find(v, leaf, value, f"{path}[{i}]")
            if found is not None:
                return found
    return None


_MERGING = re.compile(r"Error merging override (.+)")
_NOT_A_LIST = "is not a ListConfig, list or tuple"
_CONVERT = re.compile(r"could not be converted to (\w+)")
_CHOICES = re.compile(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]")
_NOT_IN = re.compile(r"Key '([^']*)' not in '(\w+)'")


def _fix(reason: str, cause: Exception) -> str:
    """OmegaConf's reason, with the nearest valid value or key when it can name one."""
    wanted = {"Float": "a number, e.g. 1.0", "Integer": "a whole number, e.g. 2", "Boolean": "true or false"}
    m = _CONVERT.search(reason)
    if m and m.group(1) in wanted:
        return f"must be {wanted[m.group(1)]}"
    m = _CHOICES.search(reason)
    if m:
        options = [o.strip() for o in m.group(2).split(",")]
        near = difflib.get_close_matches(m.group(1), options, n=1, cutoff=0.5)
        return (f"did you mean '{near[0]}'? " if near else "") + f"options: {', '.join(options)}"
    m = _NOT_IN.search(reason)
    if m:
        fields = _fields_of(m.group(2))
        near = difflib.get_close_matches(m.group(1), fields, n=1, cutoff=0.6)
        return (
            "unknown key"
            + (f"; did you mean '{near[0]}'?" if near else "")
            + (f" (keys: {', '.join(fields)})" if fields else "")
        )
    return reason


def _fields_of(class_name: str) -> list[str]:
    """Field names of the schema dataclass called `class_name` (OmegaConf names the class)."""
    import dataclasses

    from dagrl.config import schema

    cls = getattr(schema, class_name, None)
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
