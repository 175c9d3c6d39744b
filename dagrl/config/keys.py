"""The schema's keys as the command line sees them: known keys, their docs, and checks of overrides.

Every field of the dataclasses in dagrl/config/schema.py is a key (`data.train_batch_size`); its
one-line meaning is the attribute docstring written under it (read from the source with `ast`).
Fields typed as dicts (`placement.gpus`, `roles`, engine kwargs) or `Any` hold free sub-keys.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import os
import textwrap
import typing
from dataclasses import dataclass
from enum import Enum
from functools import cache

from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError


@dataclass(frozen=True)
class KeyInfo:
    key: str
    type: str
    default: object
    doc: str
    open: bool  # a dict or Any field: sub-keys are the user's (placement.gpus.<role>, roles.<name>)
    names: bool = False  # a list of strings or enum values: one name alone is a list of one


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass: {field: the string literal written under it}."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, [*body[1:], None]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            if isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return (_type_name(inner[0]) if len(inner) == 1 else "|".join(map(_type_name, inner))) + "|null"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "|".join(dict.fromkeys(m.value for m in tp))
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{','.join(map(_type_name, args))}]"
    return getattr(tp, "__name__", str(tp)).replace("Any", "any")


def _is_open(tp) -> bool:
    inner = (
        [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) is typing.Union
        else [tp]
    )
    return any(t is typing.Any or typing.get_origin(t) is dict or t is dict for t in inner)


def _is_name_list(tp) -> bool:
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is list and typing.get_args(tp) else None
    return item is str or (isinstance(item, type) and issubclass(item, Enum))


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


@cache
def schema_keys() -> dict[str, KeyInfo]:
    """Every leaf key of the schema, in declaration order; sections are not listed."""
    out: dict[str, KeyInfo] = {}

    def walk(cls: type, prefix: str) -> None:
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        for f in dataclasses.fields(cls):
            tp, key = hints[f.name], prefix + f.name
            if dataclasses.is_dataclass(tp):
                walk(tp, key + ".")
                continue
            default = _default(f)
            default = default.value if isinstance(default, Enum) else default
            if isinstance(default, list):
                default = [d.value if isinstance(d, Enum) else d for d in default]
            doc = docs.get(f.name, "")
            out[key] = KeyInfo(key, _type_name(tp), default, doc, _is_open(tp), _is_name_list(tp))

    walk(DagrlConfig, "")
    return out


@cache
def sections() -> frozenset[str]:
    """Keys that name a whole dataclass (`actor_rollout_ref.rollout.val_kwargs`)."""
    return frozenset(".".join(k.split(".")[:n]) for k in schema_keys() for n in range(1, len(k.split("."))))


def config_groups(conf_dir: str) -> dict[str, list[str]]:
    """Hydra config groups under conf/ (algorithm, placement) and their options."""
    groups = {}
    for name in sorted(os.listdir(conf_dir)):
        path = os.path.join(conf_dir, name)
        if os.path.isdir(path) and name != "dags":
            groups[name] = sorted(  # nested options too: experiment=gkd/rollout_colocate_teacher_colocate
                os.path.relpath(os.path.join(root, f), path)[: -len(".yaml")]
                for root, _, files in os.walk(path)
                for f in files
                if f.endswith(".yaml")
            )
    return groups


def suggest(key: str) -> str:
    """' Did you mean ...?' with the nearest real key, or ''."""
    keys = list(schema_keys())
    match = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    if not match:  # a misspelt last part: compare it with the last parts of the keys
        last = key.rsplit(".", 1)[-1]
        by_last = {k.rsplit(".", 1)[-1]: k for k in reversed(keys)}
        near = difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.8)
        match = [by_last[near[0]]] if near else []
    return f"; did you mean '{match[0]}'?" if match else ""


def check_key(key: str, value: object, defaults: dict[str, object]) -> None:
    """Refuse an override of a key the schema lacks (with or without `+`), naming the nearest one.

    `defaults` maps open dict keys to their default contents: a plain override inside them must name
    an existing entry, `+` adds one (`+placement.gpus.judge=1`), and a near miss of an entry is a typo.
    """
    known = schema_keys()
    if key in known or key in sections() or key.startswith("hydra."):
        return
    parent = next((p for p in _prefixes(key) if p in known), None)
    if parent is not None and known[parent].open:
        existing = defaults.get(parent)
        entries = [str(k) for k in existing] if isinstance(existing, dict) else []
        sub = key[len(parent) + 1 :].split(".")[0]
        near = difflib.get_close_matches(sub, entries, n=1, cutoff=0.75)
        if near and sub not in entries:
            raise ConfigError(key, value, f"unknown entry; did you mean '{parent}.{near[0]}'?")
        return
    fix = "unknown key" + (suggest(key) or "; python -m dagrl.main --help lists every key")
    raise ConfigError(key, value, fix)


def is_new_entry(key: str, defaults: dict[str, object]) -> bool:
    """Whether `key` adds an entry to an open dict field (Hydra needs `+` for that; dagrl adds it)."""
    known = schema_keys()
    parent = next((p for p in _prefixes(key) if p in known), None)
    if parent is None or not known[parent].open:
        return False
    existing = defaults.get(parent)
    return key[len(parent) + 1 :].split(".")[0] not in (existing if isinstance(existing, dict) else {})


def _prefixes(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]


def check_tree(tree: dict, prefix: str = "") -> None:
    """Refuse keys in a composed config (a plain nested dict) that the schema lacks: what `+key`
    or a preset file added on top of the dataclasses."""
    known, secs = schema_keys(), sections()
    for name, value in tree.items():
        key = prefix + str(name)
        if key in known:
            continue
        if key in secs and isinstance(value, dict):
            check_tree(value, key + ".")
            continue
        raise ConfigError(key, value, "unknown key" + (suggest(key) or "; see python -m dagrl.main --help"))


def help_text(conf_dir: str) -> str:
    """`python -m dagrl.main --help`: usage, config groups, then every key with type, default, meaning."""
    lines = [
        "usage: python -m dagrl.main [--help] [--cfg job] [--config FILE.yaml] [group=option ...] [key=value ...]",
        "",
        "With no arguments: GRPO on the built-in arithmetic task with the shipped tiny model, on the CPU.",
        "trainer.dry_run=true prints the placement plan and stops before Ray starts; --cfg job prints the",
        "resolved config that would run. verl / siiRL / ms-swift key names: docs/compat.md. --config runs",
        "one YAML file (dagrl's keys, or ms-swift's Ray form: examples/ms_swift/); overrides apply after it.",
        "Defaults below are the schema's; the default job (conf/config.yaml) also sets",
        "trainer.total_training_steps=40 unless trainer.total_epochs is given.",
        "",
        "config groups:",
    ]
    for group, options in config_groups(conf_dir).items():
        lines.append(f"  {group}={'|'.join(options)}")
    lines += ["", "keys (type, default):"]
    section = None
    for info in schema_keys().values():
        head = info.key.split(".")[0]
        if head != section:
            section = head
            lines.append("")
        lines.append(f"  {info.key}  ({info.type}, default {_show(info.default)})")
        if info.doc:
            lines.append(f"      {info.doc}")
    return "\n".join(lines)


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
