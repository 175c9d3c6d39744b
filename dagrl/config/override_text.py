"""Values written back as Hydra override text (`key=<value>`): what the compatibility layer and the
--config file reader produce from values they parsed, quoted so Hydra reads them back unchanged."""

from __future__ import annotations

import re


def render_value(value: object) -> str:
    """A parsed value written back in Hydra's override syntax (strings quoted, so `=`, `,`, `:` and
    spaces inside them survive); the inverse of the override parser's `value()`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # Hydra unescapes only backslashes that precede a quote or end the string
        escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
        return "'" + escaped.replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{render_key(k)}:{render_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write a {type(value).__name__} as an override")


def render_key(key: object) -> str:
    text = str(key)
    if not re.fullmatch(r"[A-Za-z_][\w\-]*", text):
        raise ValueError(f"the mapping key {text!r} cannot be written as an override key")
    return text
