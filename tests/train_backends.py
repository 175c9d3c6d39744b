"""A train backend built outside a pool the way a worker builds it: from its role's spec and, for a
trained role, the objective the driver builds (dagrl/objectives: role_objectives)."""

from __future__ import annotations

from dagrl.config.role_specs import role_spec
from dagrl.config.roles import Role
from dagrl.objectives import role_objectives


def train_backend(cls, cfg, ctx, spec=None):
    """`cls` (TorchTrainBackend, MegatronTrainBackend) for `spec`, the train role's when None."""
    spec = spec or role_spec(cfg, Role.train)
    return cls(spec, ctx, role_objectives(cfg, [spec]).get(spec.name))
