"""Advantage estimators, chosen by `algorithm.adv_estimator`.

An estimator turns the token rewards ``[B, R]`` (plus the batch keys it declares) into
advantages ``[B, R]``, and carries the config rules its math depends on (GRPO's groups need
rollout.n >= 2). The math is in dagrl/algos; adding one is an `AdvEstimator` member and a
registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from dagrl.algos import compute_grpo_advantages
from dagrl.config.schema import AdvEstimator, AlgorithmConfig, DagrlConfig
from dagrl.core.batch import Batch
from dagrl.errors import ConfigError

# (token_rewards [B, R], batch with required_keys and response_mask, algorithm config) -> [B, R]
Estimate = Callable[[Tensor, Batch, AlgorithmConfig], Tensor]


@dataclass(frozen=True)
class Estimator:
    estimate: Estimate
    required_keys: tuple[str, ...]  # batch keys besides response_mask
    validate: Callable[[DagrlConfig], None]  # its config rules (ConfigError)


_ESTIMATORS: dict[AdvEstimator, Estimator] = {}


def register_estimator(
    name: AdvEstimator, required_keys: tuple[str, ...], validate: Callable[[DagrlConfig], None]
):
    def wrap(estimate: Estimate) -> Estimate:
        entry = _ESTIMATORS.get(name)
        if entry is not None and entry.estimate is not estimate:
            raise ValueError(f"advantage estimator {name.value!r} is registered twice")
        _ESTIMATORS[name] = Estimator(estimate, tuple(required_keys), validate)
        return estimate

    return wrap


def estimator(name: AdvEstimator) -> Estimator:
    assert name in _ESTIMATORS, f"no advantage estimator registered for {name}"
    return _ESTIMATORS[name]


def _check_groups(cfg: DagrlConfig) -> None:
    n = cfg.actor_rollout_ref.rollout.n
    if n < 2:
        raise ConfigError(
            "actor_rollout_ref.rollout.n",
            n,
            "GRPO compares responses within a group: use rollout.n >= 2 (e.g. 8)",
        )


@register_estimator(AdvEstimator.grpo, required_keys=("group_ids",), validate=_check_groups)
def grpo_advantages(token_rewards: Tensor, batch: Batch, algo: AlgorithmConfig) -> Tensor:
    """Group-relative: each response's total reward against its group's mean (and std, unless
    algorithm.norm_adv_by_std_in_grpo=false, as Dr. GRPO)."""
    return compute_grpo_advantages(
        token_rewards.sum(1),
        batch["group_ids"],
        batch["response_mask"].float(),
        norm_by_std=algo.norm_adv_by_std_in_grpo,
    )
