"""Node kinds: a registry of the steps a DAG is built from.

A kind declares the batch keys it needs, may use, and produces, and whether it runs on a
role's worker pool (remote) or on the driver. Users add kinds from modules named in
`external_plugins` with `@register_node_kind("name")`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from dagrl.core.batch import Batch

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
    import dagrl.nodes  # noqa: F401  (registers the built-in kinds)

    return dict(_KINDS)
