"""What the actor update optimises: objectives (keyed by `algorithm.name`) and advantage
estimators (keyed by `algorithm.adv_estimator`), each a registry over the math in dagrl/algos."""

from dagrl.objectives.advantage import Estimator, estimator, register_estimator
from dagrl.objectives.base import (
    Objective,
    TokenOutputs,
    TokenRequest,
    build_objective,
    micro_batch_weights,
    objective_entry,
    register_objective,
)

__all__ = [
    "Estimator",
    "Objective",
    "TokenOutputs",
    "TokenRequest",
    "build_objective",
    "check_algorithm",
    "estimator",
    "micro_batch_weights",
    "objective_entry",
    "register_estimator",
    "register_objective",
]


def check_algorithm(cfg) -> None:
    """The chosen objective's and advantage estimator's own config rules (ConfigError)."""
    objective_entry(cfg.algorithm.name).validate(cfg)
    estimator(cfg.algorithm.adv_estimator).validate(cfg)
