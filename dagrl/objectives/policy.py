"""Policy-gradient objectives on sampled responses: GRPO, Dr. GRPO, GSPO.

All three minimise a clipped surrogate of the advantage-weighted likelihood ratio, minus an
entropy bonus, plus (with actor.use_kl_loss) a KL penalty to the reference model; they differ in
the surrogate (token ratios or one ratio per response) and in how token losses are averaged.
The math is in dagrl/algos; this module maps the config onto it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor

from dagrl.algos import (
    KLEstimator,
    LossAggMode,
    agg_loss,
    compute_gspo_policy_loss,
    compute_policy_loss,
    kl_penalty,
)
from dagrl.config.schema import Algorithm, DagrlConfig
from dagrl.core.batch import Batch
from dagrl.errors import ConfigError
from dagrl.objectives.base import TokenOutputs, TokenRequest, micro_batch_weights, register_objective

A = "actor_rollout_ref.actor"

# (old_logprobs, logprobs, advantages, response_mask) -> (loss, metrics), all [B, R]
PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]]


class PolicyGradientObjective:
    """``policy_loss - entropy_coeff * entropy (+ kl_loss_coef * KL(actor || reference))``.

    Entropy and KL are aggregated like the policy loss (actor.loss_agg_mode)."""

    def __init__(self, cfg: DagrlConfig, policy_loss: PolicyLoss):
        a = cfg.actor_rollout_ref.actor
        self.policy_loss = policy_loss
        self.mode = LossAggMode(a.loss_agg_mode)
        self.norm_length = cfg.data.max_response_length  # seq-mean-token-sum-norm's constant
        self.entropy_coeff = a.entropy_coeff
        self.kl_loss_coef = a.kl_loss_coef if a.use_kl_loss else None
        self.kl_estimator = KLEstimator.parse(a.kl_loss_type)
        kl = ("ref_logprobs",)
        self.required_keys = ("response_mask", "old_logprobs", "advantages", *(kl if a.use_kl_loss else ()))
        self.optional_keys = () if a.use_kl_loss else kl  # a DAG with KL in the reward passes them on
        # entropy is always reported; it needs a graph only when it is in the loss
        self.request = TokenRequest(logprobs=True, entropy=True, entropy_grad=a.entropy_coeff != 0)

    def micro_batch_weights(self, mini: Batch, micro_batches: list[Batch]) -> list[float]:
        return micro_batch_weights(mini, micro_batches, per_token=not self.mode.per_sequence)

    def loss(self, mb: Batch, out: TokenOutputs) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb["response_mask"].float()
        pg_loss, metrics = self.policy_loss(mb["old_logprobs"], out.logprobs, mb["advantages"], mask)
        entropy_loss = agg_loss(out.entropy, mask, self.mode, self.norm_length)
        loss = pg_loss - self.entropy_coeff * entropy_loss
        metrics = dict(metrics, **{"actor/pg_loss": pg_loss.detach(), "actor/entropy": entropy_loss.detach()})
        if self.kl_loss_coef is not None:
            kl = kl_penalty(out.logprobs, mb["ref_logprobs"], self.kl_estimator)
            kl_loss = agg_loss(kl, mask, self.mode, self.norm_length)
            loss = loss + self.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        return loss, metrics


def _clip_range(cfg: DagrlConfig) -> tuple[float, float]:
    a = cfg.actor_rollout_ref.actor
    low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
    high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
    return low, high


def _ppo_clip(cfg: DagrlConfig) -> PolicyLoss:
    low, high = _clip_range(cfg)
    a = cfg.actor_rollout_ref.actor
    return partial(
        compute_policy_loss,
        clip_ratio_low=low,
        clip_ratio_high=high,
        loss_agg_mode=LossAggMode(a.loss_agg_mode),
        clip_ratio_c=a.clip_ratio_c,
        norm_length=cfg.data.max_response_length,
    )


@register_objective(Algorithm.grpo)
def grpo(cfg: DagrlConfig) -> PolicyGradientObjective:
    """GRPO (Shao et al. 2024, "DeepSeekMath", §4.1): PPO's token-level clipped surrogate with
    group-relative advantages (dual-clip and clip-higher as configured)."""
    return PolicyGradientObjective(cfg, _ppo_clip(cfg))


def _check_dr_grpo(cfg: DagrlConfig) -> None:
    """Dr. GRPO is GRPO without its two normalisations; a config that puts either back is not it."""
    mode = cfg.actor_rollout_ref.actor.loss_agg_mode
    if mode != LossAggMode.seq_mean_token_sum_norm:
        raise ConfigError(
            f"{A}.loss_agg_mode",
            mode.value,
            "Dr. GRPO divides every response's token sum by one constant: use seq-mean-token-sum-norm"
            " (the preset algorithm=dr_grpo sets it), or algorithm=grpo for GRPO with another mode",
        )
    if cfg.algorithm.norm_adv_by_std_in_grpo:
        raise ConfigError(
            "algorithm.norm_adv_by_std_in_grpo",
            True,
            "Dr. GRPO does not divide advantages by the group std: set it to false (the preset"
            " algorithm=dr_grpo does), or use algorithm=grpo",
        )


@register_objective(Algorithm.dr_grpo, validate=_check_dr_grpo)
def dr_grpo(cfg: DagrlConfig) -> PolicyGradientObjective:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO's surrogate with
    constant-length aggregation (checked by `_check_dr_grpo`) and advantages without std."""
    return PolicyGradientObjective(cfg, _ppo_clip(cfg))


def _check_gspo(cfg: DagrlConfig) -> None:
    mode = cfg.actor_rollout_ref.actor.loss_agg_mode
    if not mode.per_sequence:
        raise ConfigError(
            f"{A}.loss_agg_mode",
            mode.value,
            "GSPO's loss is a mean over responses, so micro-batches are weighted by rows: use a"
            " seq-mean-* mode (the preset algorithm=gspo sets seq-mean-token-mean)",
        )


@register_objective(Algorithm.gspo, validate=_check_gspo)
def gspo(cfg: DagrlConfig) -> PolicyGradientObjective:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one length-normalised
    importance ratio per response, clipped per response (no dual-clip)."""
    low, high = _clip_range(cfg)
    return PolicyGradientObjective(
        cfg, partial(compute_gspo_policy_loss, clip_ratio_low=low, clip_ratio_high=high)
    )
