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
    if _runs_advantages(cfg.dag):  # SFT's and the sampling DAGs have no advantage node
        estimator(cfg.algorithm.adv_estimator).validate(cfg)


def _runs_advantages(dag: str) -> bool:
    import os

    from dagrl.core.dag import dag_path, load_dag_specs

    if not os.path.isfile(dag_path(dag)):
        return True  # the DAG loader reports the missing file
    return any(spec.kind == "advantage" for spec in load_dag_specs(dag)[1])
