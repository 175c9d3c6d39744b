"""Advantage estimators, chosen by `algorithm.adv_estimator`.

An estimator turns the token rewards ``[B, R]`` (plus the batch keys it declares) into
advantages ``[B, R]``, and carries the config rules its math depends on (GRPO's groups need
rollout.n >= 2; they run when the DAG has an advantage node). The math is in dagrl/algos;
adding one is `@register_estimator("name", ...)` (in an `external_plugins` module for a plugin).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from dagrl.algos import compute_grpo_advantages
from dagrl.algos.advantages import (
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_rloo_advantages,
)
from dagrl.algos.value import compute_gae_advantages
from dagrl.config.schema import AlgorithmConfig, DagrlConfig
from dagrl.config.validate_rollout import greedy_setting
from dagrl.core.batch import Batch
from dagrl.errors import ConfigError
from dagrl.registry import ESTIMATORS, EstimatorEntry

# (token_rewards [B, R], batch with required_keys and response_mask, algorithm config) -> [B, R]
Estimate = Callable[[Tensor, Batch, AlgorithmConfig], Tensor]


Estimator = EstimatorEntry


def register_estimator(
    name: str,
    required_keys: tuple[str, ...],
    validate: Callable[[DagrlConfig], None],
    token_level: bool = False,
    critic_targets: bool = False,
):
    """Register `estimate` under `name` (the value of `algorithm.adv_estimator`). `token_level`:
    it reads the rewards token by token (returns), so a multi-turn episode's per-turn rewards are
    put into the token rewards for it (turn_reward_mode=turn) rather than credited beside it.
    `critic_targets`: it learns from a critic's `values` and returns (advantages, returns), the
    critic's targets (the run then has a critic: config/critic_role.py critic_runs)."""

    def wrap(estimate: Estimate) -> Estimate:
        entry = EstimatorEntry(estimate, tuple(required_keys), validate, token_level, critic_targets)
        ESTIMATORS.register(name, entry, same=lambda a, b: a.estimate is b.estimate)
        return estimate

    return wrap


def estimator(name: str) -> Estimator:
    return ESTIMATORS.get(name)


def _check_groups(cfg: DagrlConfig) -> None:
    """A group baseline needs a group, whose responses can differ: with greedy decoding every
    response to a prompt is the same, so every advantage is 0 and the run learns nothing, unless
    another term gives a signal (an entropy bonus, the distillation reward's per-token term, or
    multi-turn episodes whose tool outputs may differ)."""
    n, name = cfg.actor_rollout_ref.rollout.n, cfg.algorithm.adv_estimator
    if n < 2:
        raise ConfigError(
            "actor_rollout_ref.rollout.n",
            n,
            f"algorithm.adv_estimator={name} compares responses within a group: use rollout.n >= 2"
            " (e.g. 8), or algorithm.adv_estimator=reinforce_plus_plus, which needs no group",
        )
    greedy = greedy_setting(cfg)
    other_signal = (
        cfg.actor_rollout_ref.actor.entropy_coeff > 0
        or cfg.algorithm.distill_reward.coef != 0
        or cfg.actor_rollout_ref.rollout.multi_turn.enable
    )
    if greedy is not None and not other_signal:
        key, value, sample = greedy
        raise ConfigError(
            key,
            value,
            f"greedy decoding makes the {n} responses to a prompt identical, so algorithm.adv_estimator="
            f"{name}, which compares them, gives every advantage 0 and the run learns nothing: {sample}"
            " to sample, or use rollout.n=1 with algorithm.adv_estimator=reinforce_plus_plus (no group)",
        )


def _no_rules(cfg: DagrlConfig) -> None:
    return None


@register_estimator("grpo", required_keys=("group_ids",), validate=_check_groups)
def grpo_advantages(token_rewards: Tensor, batch: Batch, algo: AlgorithmConfig) -> Tensor:
    """Group-relative: each response's total reward against its group's mean (and std, unless
    algorithm.norm_adv_by_std_in_grpo=false, as Dr. GRPO)."""
    return compute_grpo_advantages(
        token_rewards.sum(1),
        batch["group_ids"],
        batch["response_mask"].float(),
        norm_by_std=algo.norm_adv_by_std_in_grpo,
    )


@register_estimator("rloo", required_keys=("group_ids",), validate=_check_groups)
def rloo_advantages(token_rewards: Tensor, batch: Batch, algo: AlgorithmConfig) -> Tensor:
    """Leave-one-out: each response's total reward against the mean of the rest of its group."""
    return compute_rloo_advantages(token_rewards.sum(1), batch["group_ids"], batch["response_mask"].float())


@register_estimator("reinforce_plus_plus", required_keys=(), validate=_no_rules, token_level=True)
def reinforce_plus_plus_advantages(token_rewards: Tensor, batch: Batch, algo: AlgorithmConfig) -> Tensor:
    """Discounted token returns (algorithm.gamma), whitened over the batch; no group needed."""
    return compute_reinforce_plus_plus_advantages(token_rewards, batch["response_mask"].float(), algo.gamma)


@register_estimator("reinforce_plus_plus_baseline", required_keys=("group_ids",), validate=_check_groups)
def reinforce_plus_plus_baseline_advantages(
    token_rewards: Tensor, batch: Batch, algo: AlgorithmConfig
) -> Tensor:
    """Total reward minus the group mean, whitened over the batch."""
    return compute_reinforce_plus_plus_baseline_advantages(
        token_rewards.sum(1), batch["group_ids"], batch["response_mask"].float()
    )


@register_estimator(
    "gae", required_keys=("values",), validate=_no_rules, token_level=True, critic_targets=True
)
def gae_advantages(token_rewards: Tensor, batch: Batch, algo: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation on the critic's values (algorithm.gamma, algorithm.lam),
    whitened over the batch; with the returns the critic learns."""
    return compute_gae_advantages(
        token_rewards, batch["values"], batch["response_mask"].float(), algo.gamma, algo.lam
    )
