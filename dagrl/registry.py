"""Name tables of the parts a run is assembled from, open to plain strings.

Objectives, advantage estimators and backends register themselves here by name (built-ins when
their package is imported, plugins from `external_plugins` modules), so `dagrl.config` can check
a configured name and run the part's own rules by asking the table, without importing any part:

    OBJECTIVES.register("reinforce", entry)           # in the part's module
    OBJECTIVES.lookup(cfg.algorithm.name, "algorithm.name")  # in validate: entry or ConfigError

A name that is not registered is a ConfigError naming the config key, the value, the nearest
registered name and the registered ones (STYLE rule 11). This module sits on the ground floor
with dagrl.errors: it knows no config type, no backend and no objective.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from dagrl.errors import ConfigError

T = TypeVar("T")


# The packages whose import registers the built-in parts. Asked for by name on a table's first
# read, so a script that validates a config without going through dagrl.main sees the built-ins
# too, and this module still imports no part.
BUILTIN_PACKAGES = ("dagrl.objectives", "dagrl.backends", "dagrl.nodes")
_builtins_loaded = False


def load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for package in BUILTIN_PACKAGES:
            importlib.import_module(package)


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The registered name closest to `name` (None when nothing is close)."""
    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return matches[0] if matches else None


def unknown_name_fix(name: str, known: Iterable[str], what: str, how: str = "") -> str:
    """The fix part of a ConfigError for an unregistered `name`."""
    known = sorted(known)
    near = nearest(name, known)
    hint = f"did you mean {near!r}? " if near else ""
    return f"no {what} of that name; {hint}registered: {', '.join(known) or 'none'}" + (
        f" ({how})" if how else ""
    )


class Registry(Generic[T]):
    """name -> entry. Registering a name twice with a different entry is a programming error."""

    def __init__(self, what: str, how_to_add: str) -> None:
        self.what = what  # "objective", "advantage estimator", ...
        self.how_to_add = how_to_add  # said in the error for a name nobody registered
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T, same: Callable[[T, T], bool] | None = None) -> None:
        assert isinstance(name, str), f"{self.what} names are strings, got {name!r}"
        old = self._entries.get(name)
        if old is not None and not (same or (lambda a, b: a is b))(old, entry):
            raise ValueError(f"{self.what} {name!r} is registered twice ({old} and {entry})")
        self._entries[name] = entry

    def __contains__(self, name: object) -> bool:
        load_builtins()
        return name in self._entries

    def names(self) -> list[str]:
        load_builtins()
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry of a name checked before (validate); an assert for internal callers."""
        load_builtins()
        assert name in self._entries, f"no {self.what} registered under {name!r}"
        return self._entries[name]

    def lookup(self, name: str, key: str) -> T:
        """The entry under `name`, or a ConfigError under config key `key` naming the nearest."""
        load_builtins()
        if name not in self._entries:
            raise ConfigError(key, name, unknown_name_fix(name, self._entries, self.what, self.how_to_add))
        return self._entries[name]


def _no_rules(cfg: Any) -> None:
    return None


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: how to build it and what it owns besides.

    - `factory(spec, ctx, objective)` returns the backend (see dagrl/backends/registry.py).
    - `rules(cfg)`: its config rules when a role uses it, before Ray starts (ConfigError).
    - `unused_rules(cfg)`: its rules when another backend is chosen for its role kind: its own
      config section, set there, would do nothing and is refused.
    - `plan_rules(cfg, plan)`: rules that need the placement plan's DP sizes.
    - `estimate(cfg, spec, layout, shape, card_bytes, colocated) -> RoleMemory`: bytes per device
      it keeps while it runs, per phase, while a colocated role runs, and on the host
      (dagrl/backends/memory.py); None = not estimated. The memory plan, the capacity check and
      the dry run's per-role figures sum the estimates of the roles sharing a device.
    - `checkpoint(cfg, spec, layout) -> (bytes per weight, factor)`: a train backend's checkpoint
      size as weights × (1 + factor) (optimizer state, replicas); spec and layout are None when the
      DAG trains nothing. None = not estimated (the free-space check is skipped).
    - `resolve(cfg)`: fills the defaults that depend on this backend (validate's resolve_defaults).
    - `device_rules(cfg, device)`: what the resolved device must offer (GPUs, an installed engine).
    - `reads`: the keys of its role's shared section that only some backends read (a rollout
      engine's of `actor_rollout_ref.rollout`, dotted below it: "engine_kwargs.vllm"). Such a key
      set away from its default while the configured backend does not read it is refused: it
      would do nothing (dagrl/config/validate_rollout.py: check_engine_keys).
    """

    factory: Callable
    rules: Callable[[Any], None] = _no_rules
    plan_rules: Callable[[Any, Any], None] | None = None
    estimate: Callable[..., Any] | None = None
    resolve: Callable[[Any], None] | None = None
    device_rules: Callable[[Any, str], None] | None = None
    checkpoint: Callable[..., tuple[int, float]] | None = None
    reads: tuple[str, ...] = ()
    unused_rules: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class ObjectiveEntry:
    build: Callable  # (cfg) -> Objective
    validate: Callable[[Any], None] = _no_rules  # the algorithm's own config rules (ConfigError)


@dataclass(frozen=True)
class EstimatorEntry:
    estimate: Callable  # (token_rewards [B, R], batch, algorithm config) -> advantages [B, R]
    required_keys: tuple[str, ...] = ()  # batch keys besides response_mask
    validate: Callable[[Any], None] = _no_rules  # its config rules, run when the DAG has an advantage node
    # reads the rewards token by token (discounted returns): a multi-turn episode's per-turn rewards
    # join token_rewards on each turn's last policy token (turn_reward_mode=turn)
    token_level: bool = False
    # estimate returns (advantages, returns): the critic's regression targets besides (GAE)
    critic_targets: bool = False


@dataclass
class Backend:
    """One backend by name, whatever role kinds it serves (its per-kind entries are the table's
    `entries`): the devices it runs on, whether it starts before the other roles of its workers,
    and a train backend's hooks.

    - `devices`: None = every device; else the ones it runs on, `device_fix` telling the user what
      to do elsewhere (megatron: GPUs only).
    - `starts_first`: it reserves a share of the device as it starts (vLLM's
      gpu_memory_utilization is checked against the memory free at that moment), so colocated
      roles build it first, on an empty device.
    - `hooks`: a train backend's part in decoding its roles' specs and in the plan's automatic
      choices and advice (dagrl/backends/train_hooks.py: TrainHooks); None = none of its own.
    - `config_type`: the class of its own config section inside a role's section (megatron's
      MegatronConfig: `actor.megatron`, `ref.megatron`, `critic.megatron`); the role specs and the
      rules find that section by it (`BackendTable.own_section`, `sections`). None = it reads its
      role's sections only (torch: actor.*; a rollout engine: rollout.*).
    - `lora_dtypes`: a rollout engine that serves a LoRA adapter beside its base weights, in these
      engine dtypes (vLLM's kernels: 16-bit); None = it takes the merged weights.
    - `standalone_teacher`: it serves `teacher.placement=standalone` (replicas of their own).
    """

    name: str
    devices: set[str] | None = None
    device_fix: str = ""
    starts_first: bool = False
    hooks: Any = None
    config_type: type | None = None
    lora_dtypes: tuple[str, ...] | None = None
    standalone_teacher: bool = False


@dataclass
class BackendTable:
    """Backends under (role kind, name): a name is looked up among the kind's backends; what a
    backend is whatever the kind (devices, start order, hooks) is its `Backend` under `backends`."""

    entries: dict[tuple[str, str], BackendEntry] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)

    def backend(self, name: str) -> Backend:
        """The backend named `name` (an empty one for a name nothing registered yet)."""
        load_builtins()
        return self.backends.setdefault(name, Backend(name))

    def sections(self, section: Any) -> dict[str, tuple[str, Any]]:
        """The fields of a role's config section (a dataclass: actor.*, ref.*, critic.*) that are
        some backend's own section (its `config_type`): field name -> (backend, value)."""
        load_builtins()
        owners = {b.config_type: b.name for b in self.backends.values() if b.config_type is not None}
        out = {}
        for f in fields(section):
            value = getattr(section, f.name)
            if type(value) in owners:
                out[f.name] = (owners[type(value)], value)
        return out

    def own_section(self, section: Any, name: str) -> Any:
        """Backend `name`'s own section inside a role's config section (`actor.megatron` for
        megatron in actor.*); None when it has none."""
        return next((v for owner, v in self.sections(section).values() if owner == name), None)

    def kinds(self, name: str) -> list[str]:
        """The role kinds backend `name` serves."""
        load_builtins()
        return sorted(k for k, n in self.entries if n == name)

    def register(self, kind: str, name: str, entry: BackendEntry) -> None:
        old = self.entries.get((kind, name))
        if old is not None and old.factory is not entry.factory:
            raise ValueError(
                f"backend {(kind, name)} is registered twice ({old.factory} and {entry.factory})"
            )
        self.entries[(kind, name)] = entry

    def names(self, kind: str) -> list[str]:
        load_builtins()
        return sorted(n for k, n in self.entries if k == kind)

    def find(self, kind: str, name: str) -> BackendEntry | None:
        load_builtins()
        return self.entries.get((kind, name))

    def lookup(self, kind: str, name: str, key: str, how: str = "") -> BackendEntry:
        load_builtins()
        entry = self.entries.get((kind, name))
        if entry is None:
            raise ConfigError(key, name, unknown_name_fix(name, self.names(kind), f"{kind!r} backend", how))
        return entry

    def by_name(self, name: str) -> list[BackendEntry]:
        """Every entry registered under `name` (a name may serve several role kinds)."""
        load_builtins()
        return [e for (_, n), e in self.entries.items() if n == name]


OBJECTIVES: Registry[ObjectiveEntry] = Registry(
    "objective", "register one with @register_objective('name') in an external_plugins module"
)
ESTIMATORS: Registry[EstimatorEntry] = Registry(
    "advantage estimator", "register one with @register_estimator('name', ...) in an external_plugins module"
)
BACKENDS = BackendTable()
