"""The DAG of one training step, loaded from conf/dags/<name>.yaml and validated before any worker starts.

File format:

    source: [prompts, prompt_mask, group_ids, data_source, ground_truth, extra_info]  # from the data
    nodes:
      rollout:
        kind: rollout
        role: rollout                 # remote kinds name the role whose pool runs them
        inputs: [prompts, prompt_mask]
        outputs: [responses, response_mask, rollout_logprobs]
        after: [weight_sync]          # ordering without data (optional)
    sinks: [scores]                   # keys the trainer reads from a step (optional)

A node depends on the nodes producing its inputs and on those listed in `after`. In a DAG that
declares its sinks (every shipped one), a node with outputs of which no node reads any and none is
a sink does no work anyone sees: it is pruned (`prune_unconsumed`), and so, in turn, are the
producers only it read from. A file without `sinks` keeps every node (a plugin DAG whose node
reports metrics only runs as written).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from dagrl.core.batch import KEYS
from dagrl.core.node import NodeSpec, kind_inputs, node_kinds
from dagrl.errors import DagError

DAG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "conf", "dags")


@dataclass(frozen=True)
class Dag:
    """One validated step graph (conf/dags/<name>.yaml after `prune_disabled` and `build_dag`):
    immutable once built, so the scheduler, the trainer and the validation DAG share it freely.

    `source` are the batch keys the driver collates from the data rows; `nodes` are in
    topological order; `deps` maps each node to the nodes it waits for (a read-only mapping).
    """

    name: str
    source: tuple[str, ...]
    nodes: tuple[NodeSpec, ...]  # topological order
    deps: Mapping[str, frozenset[str]]  # node -> nodes it waits for (read-only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "deps", MappingProxyType(dict(self.deps)))

    def __reduce__(self):  # a read-only mapping does not pickle; rebuild from a plain dict
        return (Dag, (self.name, self.source, self.nodes, dict(self.deps)))

    def roles(self) -> set[str]:
        return {n.role for n in self.nodes if n.role}

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)


def dag_path(name: str) -> str:
    """A DAG name from conf/dags, or a path to a yaml file."""
    if name.endswith((".yaml", ".yml")):
        return os.path.expanduser(name)
    return os.path.join(DAG_DIR, f"{name}.yaml")


@dataclass
class DagFile:
    """conf/dags/<name>.yaml as declared: the data's keys, the nodes, and the sinks (keys the trainer
    reads from a step's batch: the GKD step's `scores` for its reward metrics, the sampler's rows)."""

    source: list[str]
    specs: list[NodeSpec]
    sinks: list[str] | None = None  # None: not declared, nothing is pruned


def load_dag_specs(name: str) -> tuple[list[str], list[NodeSpec]]:
    """(source, specs) of a DAG file (`load_dag_file` without its sinks)."""
    dag_file = load_dag_file(name)
    return dag_file.source, dag_file.specs


def load_dag_file(name: str) -> DagFile:
    path = dag_path(name)
    if not os.path.isfile(path):
        import difflib

        available = sorted(f[:-5] for f in os.listdir(DAG_DIR) if f.endswith(".yaml"))
        near = difflib.get_close_matches(os.path.basename(name).removesuffix(".yaml"), available, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise DagError(
            f"dag={name!r}: no file {path}; {hint}use one of {available} or a path to a .yaml file"
        )
    try:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise DagError(f"{path}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DagError(f"{path}: cannot be read ({exc})") from None
    _check_shape(path, raw)
    specs = [NodeSpec(name=node_name, **body) for node_name, body in (raw.get("nodes") or {}).items()]
    sinks = raw.get("sinks")
    return DagFile(list(raw.get("source") or []), specs, None if sinks is None else list(sinks))


def _check_shape(path: str, raw) -> None:
    """{source: [keys], nodes: {name: {kind, role?, inputs?, outputs?, after?}}, sinks?: [keys]},
    each list of strings."""
    if not isinstance(raw, dict) or set(raw) - {"source", "nodes", "sinks"}:
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise DagError(f"{path}: a DAG file is a mapping with 'source', 'nodes' and 'sinks' only (got {got})")
    for key in ("source", "sinks"):
        if not _str_list(raw.get(key) or []):
            raise DagError(f"{path}: '{key}' must be a list of batch keys (got {raw.get(key)!r})")
    unknown = [k for k in raw.get("sinks") or [] if k not in KEYS]
    if unknown:
        raise DagError(f"{path}: sinks {unknown} are not declared batch keys; declared keys: {sorted(KEYS)}")
    nodes = raw.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise DagError(f"{path}: 'nodes' must map node names to their kind, role, inputs and outputs")
    for node_name, body in nodes.items():
        fields = sorted(body) if isinstance(body, dict) else body
        if (
            not isinstance(body, dict)
            or set(body) - {"kind", "role", "inputs", "outputs", "after"}
            or "kind" not in body
        ):
            raise DagError(
                f"{path}: node {node_name!r} needs 'kind' and may only have kind/role/inputs/outputs/after"
                f" (got {fields!r})"
            )
        for key in ("kind", "role"):
            if key in body and not isinstance(body[key], str):
                raise DagError(f"{path}: node {node_name!r}: '{key}' must be a name (got {body[key]!r})")
        for key in ("inputs", "outputs", "after"):
            if not _str_list(body.get(key) or []):
                raise DagError(
                    f"{path}: node {node_name!r}: '{key}' must be a list of names (got {body[key]!r})"
                )


def _str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def build_dag(name: str, source: list[str], specs: list[NodeSpec], roles_with_pool: set[str]) -> Dag:
    """Validate kinds, keys, roles, producers, cycles; return the DAG in topological order."""
    kinds = node_kinds()
    producers: dict[str, str] = {key: "<data>" for key in source}
    for spec in specs:
        _check_node(name, spec, kinds, roles_with_pool)
        for key in spec.outputs:
            if key in producers:
                raise DagError(
                    f"dag {name}: key {key!r} is produced twice (by {producers[key]} and {spec.name})"
                )
            producers[key] = spec.name
    names = {s.name for s in specs}
    deps: dict[str, frozenset[str]] = {}
    for spec in specs:
        missing = [k for k in spec.inputs if k not in producers]
        if missing:
            raise DagError(
                f"dag {name}: node {spec.name!r} reads {missing}, which no node produces and the data"
                f" does not provide (source: {sorted(source)}); add a node that outputs it"
            )
        bad_after = [a for a in spec.after if a not in names]
        if bad_after:
            raise DagError(f"dag {name}: node {spec.name!r} runs after unknown node(s) {bad_after}")
        deps[spec.name] = frozenset({producers[k] for k in spec.inputs} - {"<data>"} | set(spec.after))
    order = _topological_order(name, specs, deps)
    return Dag(name=name, source=tuple(source), nodes=tuple(order), deps=deps)


def _check_node(dag: str, spec: NodeSpec, kinds: dict[str, type], roles_with_pool: set[str]) -> None:
    where = f"dag {dag}: node {spec.name!r}"
    if spec.kind not in kinds:
        raise DagError(
            f"{where}: unknown kind {spec.kind!r}; known kinds: {sorted(kinds)} (add your own"
            " with @register_node_kind in a module listed in external_plugins)"
        )
    kind = kinds[spec.kind]
    for key in (*spec.inputs, *spec.outputs):
        if key not in KEYS:
            raise DagError(f"{where}: undeclared batch key {key!r}; declared keys: {sorted(KEYS)}")
    required = spec.required_inputs if spec.required_inputs is not None else tuple(kind.required_inputs)
    optional = spec.optional_inputs if spec.optional_inputs is not None else tuple(kind.optional_inputs)
    need = [k for k in required if k not in spec.inputs]
    if need:
        raise DagError(
            f"{where}: kind {spec.kind} needs inputs {need} (under this config); add them to its 'inputs'"
        )
    extra_in = [k for k in spec.inputs if k not in (*required, *optional)]
    extra_out = [k for k in spec.outputs if k not in kind.outputs]
    if extra_in or extra_out:
        raise DagError(
            f"{where}: kind {spec.kind} does not read {extra_in} / produce {extra_out}"
            f" (reads {list(required + optional)}, produces {list(kind.outputs)})"
        )
    if kind.remote and not spec.role:
        raise DagError(f"{where}: kind {spec.kind} runs on a worker pool; give it a 'role'")
    if not kind.remote and spec.role:
        raise DagError(f"{where}: kind {spec.kind} runs on the driver; remove its 'role'")
    if spec.role and spec.role not in roles_with_pool:
        raise DagError(
            f"{where}: role {spec.role!r} has no worker pool; roles with pools: "
            f"{sorted(roles_with_pool)} (see placement.colocate_groups / placement.gpus)"
        )


def _topological_order(dag: str, specs: list[NodeSpec], deps: dict[str, frozenset[str]]) -> list[NodeSpec]:
    done: set[str] = set()
    order: list[NodeSpec] = []
    pending = list(specs)
    while pending:
        ready = [s for s in pending if deps[s.name] <= done]
        if not ready:
            raise DagError(f"dag {dag}: cycle among nodes {sorted(s.name for s in pending)}")
        for s in ready:
            order.append(s)
            done.add(s.name)
        pending = [s for s in pending if s.name not in done]
    return order


def check_node_rules(specs: list[NodeSpec], cfg) -> None:
    """Each kind's own config rules (`check_config(cfg, spec)`, ConfigError), for the nodes this
    config runs (after `prune_disabled`): a rule runs when the DAG has its node."""
    kinds = node_kinds()
    for spec in specs:
        check = getattr(kinds.get(spec.kind), "check_config", None)  # optional part of NodeKind
        if check is not None:
            check(cfg, spec)


def prune_disabled(specs: list[NodeSpec], cfg) -> list[NodeSpec]:
    """The specs as this config runs them: nodes whose kind is disabled dropped, with the optional
    inputs they would have made, each kind's inputs resolved for the config (`kind_inputs`), so
    that build_dag checks what e.g. the configured objective reads, and roles the config runs
    elsewhere renamed (`role_aliases`: a `self_current` teacher is the train role)."""
    from dagrl.config.roles import role_aliases  # the config's layer: imported when a config is at hand

    kinds = node_kinds()
    aliases = role_aliases(cfg)
    known = {s.name for s in specs}
    kept = [s for s in specs if s.kind not in kinds or kinds[s.kind].enabled(cfg)]
    dropped_outputs = {k for s in specs if s not in kept for k in s.outputs}
    kept_names = {s.name for s in kept}
    result = []
    for s in kept:
        # an unknown kind is left for build_dag to report
        required, optional = kind_inputs(kinds[s.kind], cfg) if s.kind in kinds else (None, None)
        inputs = [k for k in s.inputs if not (k in dropped_outputs and k in (optional or ()))]
        after = [a for a in s.after if a in kept_names or a not in known]
        role = aliases.get(s.role, s.role)
        result.append(NodeSpec(s.name, s.kind, role, inputs, list(s.outputs), after, required, optional))
    return result


def prune_unconsumed(specs: list[NodeSpec], sinks: list[str] | None) -> list[NodeSpec]:
    """The specs without the producers whose outputs nothing reads: no node's inputs, no sink.
    Repeated, so a producer read only by a pruned node goes too. Nodes without outputs (the
    update, the weight sync) act by running and stay, and so do nodes another waits for (`after`).
    `sinks` None (the DAG file declares none): every node stays."""
    if sinks is None:
        return specs
    while True:
        read = {k for s in specs for k in s.inputs} | set(sinks)
        waited = {a for s in specs for a in s.after}
        idle = {s.name for s in specs if s.outputs and s.name not in waited and not set(s.outputs) & read}
        if not idle:
            return specs
        specs = [s for s in specs if s.name not in idle]
