"""Typed handles: the calls the engine makes into a role, as methods readers can follow.

Each method forwards to the backend method declared in dagrl/backends/protocols.py, which says
how the call is dispatched, executed and collected. A plugin role uses the plain `RoleHandle.call`
with its own `@role_method`-declared methods.
"""

from __future__ import annotations

from dagrl.backends.protocols import CriticBackend, RolloutBackend, TeacherBackend, TrainBackend
from dagrl.config.roles import Role, RoleSpec
from dagrl.core.batch import Batch
from dagrl.core.pools import RoleHandle, WorkerPool
from dagrl.registry import BACKENDS


class TrainRole(RoleHandle):
    """train, ref, and a colocated teacher: a train backend (ref/teacher in forward-only mode)."""

    def forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, list[dict]]:
        return self.call(TrainBackend.forward_logprobs, batch, output_key=output_key)

    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, list[dict]]:
        return self.call(TrainBackend.teacher_topk, batch, k=k, temperature=temperature)

    def teacher_hidden(self, batch: Batch) -> tuple[Batch, list[dict]]:
        return self.call(TrainBackend.teacher_hidden, batch)

    def train_step(self, batch: Batch) -> tuple[Batch, list[dict]]:
        return self.call(TrainBackend.train_step, batch)

    def save(self, path: str) -> None:
        self.call(TrainBackend.save, path)

    def load(self, path: str) -> None:
        self.call(TrainBackend.load, path)

    def export_hf(self, path: str) -> None:
        self.call(TrainBackend.export_hf, path)


class CriticRole(RoleHandle):
    """PPO's value model (role critic)."""

    def compute_values(self, batch: Batch) -> tuple[Batch, list[dict]]:
        return self.call(CriticBackend.compute_values, batch)

    def train_step(self, batch: Batch) -> tuple[Batch, list[dict]]:
        return self.call(CriticBackend.train_step, batch)

    def save(self, path: str) -> None:
        self.call(CriticBackend.save, path)

    def load(self, path: str) -> None:
        self.call(CriticBackend.load, path)


class RolloutRole(RoleHandle):
    def generate(self, batch: Batch, seed: int, validate: bool = False) -> tuple[Batch, list[dict]]:
        return self.call(RolloutBackend.generate, batch, seed=seed, validate=validate)


class StandaloneTeacherRole(RoleHandle):
    """A standalone teacher's replicas (teacher.placement=standalone)."""

    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, list[dict]]:
        return self.call(TeacherBackend.teacher_topk, batch, k=k, temperature=temperature)


def make_handle(spec: RoleSpec, pool: WorkerPool) -> RoleHandle:
    """The typed handle of a role: by kind for the built-in ones, the plain handle for plugin roles.
    A train backend is any backend registered for the train role (torch, megatron, a plugin's)."""
    train_backend = spec.backend in BACKENDS.names(Role.train)
    if spec.kind == Role.rollout:
        return RolloutRole(spec.name, pool)
    if spec.kind == Role.critic:
        return CriticRole(spec.name, pool)
    if spec.kind == Role.teacher and not train_backend:
        return StandaloneTeacherRole(spec.name, pool)
    if train_backend and spec.kind in (Role.train, Role.ref, Role.teacher):
        return TrainRole(spec.name, pool)
    return RoleHandle(spec.name, pool)


def train_role(runtime, name: str) -> TrainRole:
    handle = runtime.role(name)
    assert isinstance(handle, TrainRole), f"role {name!r} does not run a train backend"
    return handle


def critic_role(runtime, name: str) -> CriticRole:
    handle = runtime.role(name)
    assert isinstance(handle, CriticRole), f"role {name!r} does not run a critic backend"
    return handle


def rollout_role(runtime, name: str) -> RolloutRole:
    handle = runtime.role(name)
    assert isinstance(handle, RolloutRole), f"role {name!r} does not run a rollout backend"
    return handle


def teacher_role(runtime, name: str) -> TrainRole | StandaloneTeacherRole:
    """A colocated teacher (a forward-only train backend) or a standalone one: both score top-k."""
    handle = runtime.role(name)
    assert isinstance(handle, (TrainRole, StandaloneTeacherRole)), f"role {name!r} is not a teacher"
    return handle
