"""What the actor update optimises: objectives (keyed by `algorithm.name`) and advantage
estimators (keyed by `algorithm.adv_estimator`), each a registry over the math in dagrl/algos.
Importing the package registers the built-ins."""

from dagrl.objectives import distill, policy  # noqa: F401  (register the built-in objectives)
from dagrl.objectives.advantage import Estimator, estimator, register_estimator
from dagrl.objectives.base import (
    Objective,
    TokenOutputs,
    TokenRequest,
    build_objective,
    micro_batch_weights,
    objective_entry,
    register_objective,
    role_objectives,
)

__all__ = [
    "Estimator",
    "Objective",
    "TokenOutputs",
    "TokenRequest",
    "build_objective",
    "estimator",
    "micro_batch_weights",
    "objective_entry",
    "register_estimator",
    "register_objective",
    "role_objectives",
]
