"""Node kinds: a registry of the steps a DAG is built from.

A kind declares the batch keys it needs, may use, and produces, and whether it runs on a
role's worker pool (remote) or on the driver. A kind whose inputs depend on the config (the
actor update reads what the configured objective declares) also defines
`inputs_for(cfg) -> (required, optional)`; `prune_disabled` resolves it into each NodeSpec.
A kind whose work has config rules of its own (GRPO's advantage needs groups, a standalone
teacher's top-k must fit vLLM's max_logprobs) defines `check_config(cfg, spec)`: it runs, before
any worker starts, exactly when the DAG has such a node (`check_node_rules`), so the rules follow
the DAG rather than the algorithm's name.
Users add kinds from modules named in `external_plugins` with `@register_node_kind("name")`;
the built-in kinds register when `dagrl.nodes` is imported (on the first `node_kinds()` read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from dagrl.core.batch import Batch
from dagrl.registry import load_builtins

if TYPE_CHECKING:
    from dagrl.config.schema import DagrlConfig
    from dagrl.core.runtime import Runtime


@dataclass
class NodeSpec:
    """One node as declared in conf/dags/<name>.yaml."""

    name: str
    kind: str
    role: str | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    # the kind's inputs under this config (prune_disabled fills them); None = its class attributes
    required_inputs: tuple[str, ...] | None = None
    optional_inputs: tuple[str, ...] | None = None


@dataclass
class NodeResult:
    batch: Batch  # only the node's outputs
    metrics: dict[str, float] = field(default_factory=dict)


class NodeKind(Protocol):
    required_inputs: ClassVar[tuple[str, ...]]
    optional_inputs: ClassVar[tuple[str, ...]]
    outputs: ClassVar[tuple[str, ...]]
    remote: ClassVar[bool]  # True: runs on spec.role's worker pool

    def __init__(self, spec: NodeSpec, cfg: DagrlConfig) -> None: ...

    @staticmethod
    def enabled(cfg: DagrlConfig) -> bool:
        """False drops the node from the DAG for this config (e.g. ref_logprob without KL)."""
        ...

    def run(self, runtime: Runtime, batch: Batch) -> NodeResult: ...


def kind_inputs(kind: type, cfg: DagrlConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required, optional) inputs of a kind under `cfg`: its `inputs_for(cfg)` when it has one."""
    inputs_for = getattr(kind, "inputs_for", None)  # optional part of the NodeKind protocol
    if inputs_for is not None:
        return inputs_for(cfg)
    return tuple(kind.required_inputs), tuple(kind.optional_inputs)


_KINDS: dict[str, type] = {}


def register_node_kind(name: str):
    def wrap(cls: type) -> type:
        if name in _KINDS and _KINDS[name] is not cls:
            raise ValueError(f"node kind {name!r} is registered twice ({_KINDS[name]} and {cls})")
        _KINDS[name] = cls
        cls.kind_name = name
        return cls

    return wrap


def node_kinds() -> dict[str, type]:
    """The registered kinds by name, the built-ins (dagrl/nodes) and the plugins' included: the
    built-in parts register on the first read, so nothing above core imports dagrl.nodes for it."""
    load_builtins()
    return dict(_KINDS)
