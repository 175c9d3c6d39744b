"""`--config FILE.yaml`: one YAML file holds the run's settings; command-line overrides apply after it.

Two forms, told apart by their top-level keys:

- **dagrl's keys**, nested (`trainer: {n_gpus_per_node: 8}`) or dotted (`trainer.n_gpus_per_node: 8`),
  with presets as values of their group (`algorithm: gkd`, `experiment: gkd/...`);
- **ms-swift's Ray YAML** (`megatron rlhf --use_ray true --config ...`): top-level shared keys plus
  `train:`, `rollout:` and an optional `teacher:` group, with ms-swift's meanings:
  `rlhf_type` picks the algorithm; each group's `gpus` is that role's device count; roles listed
  together in `colocate_groups` share devices, and **a role in no group owns its devices** (omitting
  `colocate_groups` = separate, unlike dagrl's default placement); a `teacher:` group with `gpus` is
  standalone vLLM replicas; the cluster is what the groups add up to (split over `nnodes`); keys
  of the `train:` group are the trainer's (shared keys overridden for it). A megatron-only key
  (parallel sizes, `sequence_parallel`, `recompute_*`) selects the megatron backend. ms-swift's
  Ray jobs run on GPUs: `trainer.device=cuda`. dagrl keys may be mixed in.

Each key becomes one override whose key is its path in the file, so compat.py and keys.py judge it
like a command-line one; every key the file cannot honour is listed at once, one line each.
"""

from __future__ import annotations

import dataclasses
import difflib
import os

import yaml

from dagrl.config import compat, keys
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError

SWIFT_GROUPS = ("train", "rollout", "teacher")
SWIFT_ROLES = {"train", "rollout", "teacher"}
RLHF_TYPES = {"grpo": "grpo", "gkd": "gkd"}
# ms-swift keys that only megatron honours: their presence selects strategy=megatron
MEGATRON_ONLY = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "sequence_parallel",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
)


class ConfigFileError(ConfigError):
    """Keys of a --config file that dagrl cannot honour, one line each."""

    def __init__(self, path: str, errors: list[ConfigError]):
        self.errors = errors
        first = errors[0]
        super().__init__(first.key, first.value, first.fix)
        lines = [f"  '{e.key}' = {e.value!r}: {e.fix}" for e in errors]
        self.args = (f"{path}: {len(errors)} setting(s) cannot be honoured:\n" + "\n".join(lines),)


def file_overrides(path: str, conf_dir: str) -> list[str]:
    """The overrides a --config file stands for, in order (the command line's go after them)."""
    raw = _read(path, conf_dir)
    roots = {f.name for f in dataclasses.fields(DagrlConfig)} | set(keys.config_groups(conf_dir))
    swift = any(str(k).split(".")[0] not in roots for k in raw)
    pairs = _swift_pairs(raw) if swift else list(_dagrl_pairs(raw, ""))
    overrides, errors = [], []
    for key, value in pairs:
        try:
            text = f"{key}={compat.render_value(value)}"
        except ValueError as exc:
            errors.append(ConfigError(key, value, str(exc)))
            continue
        try:
            _check(text, conf_dir)
        except ConfigError as exc:
            errors.append(exc)
            continue
        overrides.append(text)
    if errors:
        raise ConfigFileError(path, errors)
    return overrides


def _read(path: str, conf_dir: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError("--config", path, _missing_file_fix(path, conf_dir))
    from omegaconf._utils import get_yaml_loader  # Hydra's YAML reading: 1e-6 is a float

    try:
        with open(path) as f:
            raw = yaml.load(f, Loader=get_yaml_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError("--config", path, f"not valid YAML{at} ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise ConfigError("--config", path, "the file must be a mapping of keys to values")
    return raw


def _check(text: str, conf_dir: str) -> None:
    """What compose would refuse about this one override (the file's errors are gathered first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dagrl.config.swift_keys import DEFERRED

    if text.split("=", 1)[0] in DEFERRED:
        return
    parser = OverridesParser.create()
    open_defaults = {k: i.default for k, i in keys.schema_keys().items() if i.open}
    groups = keys.config_groups(conf_dir)
    for translated in compat.translate([text], notes=False):
        o = parser.parse_override(translated)
        if o.key_or_group in groups:
            check_group_option(o.key_or_group, o.value(), conf_dir)
        else:
            keys.check_key(o.key_or_group, o.value(), open_defaults)


def _missing_file_fix(path: str, conf_dir: str) -> str:
    """No file at `path`: the nearest name in its folder, else the shipped preset it names (presets
    are `group=name`, not files), else where it was looked for and what --config takes."""
    folder = os.path.dirname(os.path.abspath(path))
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    near = difflib.get_close_matches(os.path.basename(path), names, n=1, cutoff=0.6)
    if near:
        return f"no such file; did you mean {os.path.join(os.path.dirname(path), near[0])!r}?"
    name = path.removesuffix(".yaml")
    presets = [f"{g}={name}" for g, options in keys.config_groups(conf_dir).items() if name in options]
    if presets:
        return f"no such file; {presets[0]} runs the shipped preset of that name"
    where = "" if os.path.isabs(path) else f" at {os.path.abspath(path)}"
    return (
        f"no such file{where}; --config takes the path of a YAML file of your own (FILE.yaml);"
        " a shipped preset is group=name (python -m dagrl.main --help lists them)"
    )


def check_group_option(group: str, value: object, conf_dir: str) -> None:
    """A preset that does not exist is an error naming the nearest one, never the default job."""
    options = keys.config_groups(conf_dir).get(group, [])
    if value is None or value in options:
        return
    text = str(value)
    near = difflib.get_close_matches(text.removesuffix(".yaml"), options, n=1, cutoff=0.5)
    hint = f"did you mean '{group}={near[0]}'? " if near else ""
    if os.path.isfile(text) or text.endswith(".yaml"):
        hint += f"a YAML file of your own is run with --config {text}; "
    elif os.path.isfile(text + ".yaml"):
        hint += f"a YAML file of your own is run with --config {text}.yaml; "
    elif os.path.isabs(text) or text.startswith((".", "~")):  # a path, and no file there
        hint += f"a YAML file of your own is run with --config FILE.yaml (none at {text}); "
    raise ConfigError(group, value, f"no such preset; {hint}options: {', '.join(options)}")


def _dagrl_pairs(tree: dict, prefix: str):
    """(dotted key, value) of a dagrl-keyed tree, down to schema leaves and open-dict entries."""
    known, sections = keys.schema_keys(), keys.sections()
    for name, value in tree.items():
        key = prefix + str(name)
        info = known.get(key)
        entries = info is not None and info.open and isinstance(info.default, dict)  # placement.gpus.<role>
        if isinstance(value, dict) and (key in sections or entries):
            yield from _dagrl_pairs(value, key + ".")
        else:
            yield key, value


def _swift_pairs(raw: dict) -> list[tuple[str, object]]:
    """ms-swift's Ray YAML as (key, value) pairs: dagrl keys and ms-swift keys for compat.py."""
    raw = dict(raw)
    groups = {g: dict(raw.pop(g) or {}) for g in SWIFT_GROUPS if isinstance(raw.get(g), dict)}
    rlhf_type = raw.pop("rlhf_type", "grpo")
    if rlhf_type not in RLHF_TYPES:
        raise ConfigError(
            "rlhf_type", rlhf_type, f"dagrl runs rlhf_type {' or '.join(RLHF_TYPES)} from a Ray YAML"
        )
    pairs: list[tuple[str, object]] = [("algorithm", RLHF_TYPES[rlhf_type]), ("trainer.device", "cuda")]
    trainer_keys = set(raw) | set(groups.get("train", {}))
    if any(k in trainer_keys for k in MEGATRON_ONLY):
        pairs.append(("actor_rollout_ref.actor.strategy", "megatron"))
    pairs += _placement_pairs(raw, groups)
    roots = {f.name for f in dataclasses.fields(DagrlConfig)}
    for key, value in raw.items():
        if key in roots and isinstance(value, dict):
            pairs += list(_dagrl_pairs(value, f"{key}."))
        else:
            pairs.append((str(key), value))
    for group, body in groups.items():
        for key, value in body.items():
            pairs.append((_group_key(group, str(key)), value))
    sleeps = "actor_rollout_ref.rollout.free_cache_engine"
    if raw.get("sleep_level") and all(key != sleeps for key, _ in pairs):
        pairs.append((sleeps, True))  # ms-swift sleeps its colocated engine only when sleep_level > 0
    return pairs


def _group_key(group: str, key: str) -> str:
    """A group key's override key: its own table entry or dagrl key, else (train) the shared key."""
    path = f"{group}.{key}"
    if compat.lookup(path) is not None or path in keys.schema_keys():
        return path
    if group == "train" and (compat.lookup(key) is not None or key in keys.schema_keys()):
        return key  # ms-swift merges the train group over the shared keys for the trainer
    return path  # refused by keys.check_key, naming the path in the file


def _placement_pairs(raw: dict, groups: dict[str, dict]) -> list[tuple[str, object]]:
    """Groups' gpus, colocate_groups (none = every role on devices of its own) and the cluster."""
    gpus = {g: body.pop("gpus") for g, body in groups.items() if "gpus" in body}
    colocate = raw.pop("colocate_groups", None)
    nnodes = raw.pop("nnodes", 1)
    if colocate is None:
        colocate = []
    if not isinstance(colocate, list) or not all(isinstance(g, list) for g in colocate):
        raise ConfigError("colocate_groups", colocate, "a list of role lists, e.g. [[train, rollout]]")
    for i, group in enumerate(colocate):
        unknown = [r for r in group if r not in SWIFT_ROLES]
        if unknown:
            raise ConfigError(
                f"colocate_groups[{i}]", group, f"unknown role(s) {unknown}; roles: train, rollout, teacher"
            )
    dagrl_groups = [[*g, "ref"] if "train" in g else list(g) for g in colocate]
    listed = {r for g in colocate for r in g}
    if "train" not in listed:
        dagrl_groups.insert(0, ["train", "ref"])
    pairs: list[tuple[str, object]] = [("placement.colocate_groups", dagrl_groups)]
    if "rollout" not in listed:  # a rollout on GPUs of its own never sleeps (ms-swift's separate mode)
        dagrl_groups.append(["rollout"])
        pairs.append(("actor_rollout_ref.rollout.free_cache_engine", False))
    teacher_gpus = gpus.pop("teacher", None)
    if teacher_gpus:
        pairs += [("teacher.placement", "standalone"), ("teacher.gpus", teacher_gpus)]
    for role, count in gpus.items():
        pairs.append((f"{role}.gpus", count))
    if {"train", "rollout"} <= set(gpus):
        total = sum(max(gpus.get(r, 0) for r in g) for g in colocate)
        total += sum(gpus[r] for r in ("train", "rollout") if r not in listed) + (teacher_gpus or 0)
        if not isinstance(nnodes, int) or nnodes < 1 or total % nnodes:
            raise ConfigError("nnodes", nnodes, f"the groups' {total} GPUs must split evenly over the nodes")
        pairs += [("trainer.nnodes", nnodes), ("trainer.n_gpus_per_node", total // nnodes)]
    elif nnodes != 1:
        pairs.append(("trainer.nnodes", nnodes))
    return pairs
