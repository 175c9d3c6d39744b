"""Backend registry: a role's backend is found under (role kind, name), as node kinds are.

A factory takes (spec, ctx, objective) and returns the backend: the role's spec as the plan
resolved it, the worker's parallel context and, for a trained role, the objective built in the
driver (None otherwise); never the config. Built-in factories import their implementation inside
the call, so a backend whose dependencies are missing on this machine (vLLM on a CPU box) costs
nothing until a role asks for it:

    @register_backend("rollout", "vllm", rules=check_vllm)
    def _vllm(spec, ctx, objective):
        from dagrl.backends.vllm.rollout import VLLMRolloutBackend
        return VLLMRolloutBackend(spec, ctx)

A backend brings its own config rules (`rules(cfg)`, `plan_rules(cfg, plan)`), its memory estimate
(`estimate`) and its checkpoint estimate (`checkpoint`); validate, the memory plan, the capacity
check and the preflight find them in dagrl.registry.BACKENDS.
Plugins register theirs from `external_plugins` modules (loaded in the driver and every worker).
The built-ins register when the `dagrl.backends` package is imported (dagrl/backends/builtin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum

from dagrl.config.roles import RoleSpec
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS, BackendEntry, _no_rules

BackendFactory = Callable  # (spec: RoleSpec, ctx: ParallelContext, objective: Objective | None) -> backend


def register_backend(
    kind: str | Enum,
    name: str,
    *,
    rules: Callable | None = None,
    plan_rules: Callable | None = None,
    estimate: Callable | None = None,
    resolve: Callable | None = None,
    device_rules: Callable | None = None,
    checkpoint: Callable | None = None,
    reads: tuple[str, ...] = (),
    unused_rules: Callable | None = None,
    hooks=None,
) -> Callable[[BackendFactory], BackendFactory]:
    """Register a factory (or a class taking (spec, ctx, objective)) for roles of `kind` named `name`,
    with the backend's own config rules, memory and checkpoint estimates (dagrl.registry.BackendEntry)
    and a train backend's `hooks` (dagrl.registry.Backend, whatever the kind)."""
    kind = _value(kind)

    def wrap(factory: BackendFactory) -> BackendFactory:
        entry = BackendEntry(
            factory,
            rules or _no_rules,
            plan_rules,
            estimate,
            resolve,
            device_rules,
            checkpoint,
            reads,
            unused_rules,
        )
        BACKENDS.register(kind, name, entry)
        if hooks is not None:
            BACKENDS.backend(name).hooks = hooks
        return factory

    return wrap


def restrict_devices(name: str, devices: set[str], fix: str) -> None:
    """Backend `name` runs only on `devices` ("cpu", "cuda"); `fix` tells the user what to do instead."""
    backend = BACKENDS.backend(name)
    backend.devices, backend.device_fix = set(devices), fix


def allow_device(name: str, device: str) -> None:
    """Let backend `name` run on `device` (a plugin that makes it work there, e.g. a CPU port)."""
    backend = BACKENDS.backend(name)
    if backend.devices is not None:
        backend.devices.add(device)


def start_before_others(name: str) -> None:
    """Backend `name` reserves a share of the device as it starts (vLLM's gpu_memory_utilization
    is checked against the memory free at that moment): colocated roles build it first, on an
    empty device, and it hands the device over before the next role is built."""
    BACKENDS.backend(name).starts_first = True


def describe_backend(
    name: str,
    *,
    config_type: type | None = None,
    lora_dtypes: tuple[str, ...] | None = None,
    standalone_teacher: bool = False,
) -> None:
    """What backend `name` is beyond its factories (dagrl.registry.Backend): the config section class
    it reads, the engine dtypes it serves a LoRA adapter in, whether it serves a standalone teacher."""
    backend = BACKENDS.backend(name)
    backend.config_type = config_type
    backend.lora_dtypes = lora_dtypes
    backend.standalone_teacher = standalone_teacher


def startup_order(specs: Iterable[RoleSpec]) -> list[str]:
    """Role names in the order a worker builds them: engines that reserve a share of the device
    first, the others as listed."""
    specs = list(specs)
    first = [s.name for s in specs if BACKENDS.backend(s.backend).starts_first]
    return first + [s.name for s in specs if s.name not in first]


def backend_names(kind: str | Enum) -> list[str]:
    return BACKENDS.names(_value(kind))


def check_backends(specs: Iterable[RoleSpec], device: str | None = None) -> None:
    """Every role's backend is registered (a ConfigError under the key that chose it otherwise)
    and, when `device` is given, runs on that device."""
    for spec in specs:
        backend = BACKENDS.backend(spec.backend)
        if device is not None and backend.devices is not None and device not in backend.devices:
            raise ConfigError("trainer.device", device, backend.device_fix)
        how = "" if spec.builtin else "register one with @register_backend in an external_plugins module"
        BACKENDS.lookup(spec.kind, spec.backend, spec.backend_key, how)


def build_backend(spec: RoleSpec, ctx, objective=None):
    """The backend of a role, from its spec (and a trained role's objective): what a worker runs
    for each of its roles (dagrl/core/worker.py)."""
    check_backends([spec])
    return BACKENDS.find(spec.kind, spec.backend).factory(spec, ctx, objective)


def _value(kind: str | Enum) -> str:
    return kind.value if isinstance(kind, Enum) else kind
