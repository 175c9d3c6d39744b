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
from dagrl.algos.rollout_correction import (
    CorrectionLevel,
    mismatch_metrics,
    rollout_is_weights,
    rollout_log_ratio,
    rollout_rs_mask,
)
from dagrl.config.schema import DagrlConfig, RolloutCorrectionConfig
from dagrl.config.validate_rollout import old_logprob_pass, rollout_logprobs_on
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
        # the rollout's own log-probs, when real: mismatch metrics whenever the DAG passes them on,
        # required only when a correction is asked for (it must not silently fall away)
        self.correction = cfg.algorithm.rollout_correction if rollout_logprobs_on(cfg) else None
        corrects = self.correction is not None and (
            self.correction.rollout_is is not None or self.correction.rollout_rs is not None
        )
        rollout = ("rollout_logprobs",) if corrects else ()
        # recompute_old_logprobs=false (validated on-policy): the update's own log-probs, detached
        old = ("old_logprobs",) if old_logprob_pass(cfg) else ()
        self.required_keys = ("response_mask", *old, "advantages", *rollout, *(kl if a.use_kl_loss else ()))
        # what a DAG may pass on: used when present (rollout log-probs: mismatch metrics), else not
        self.optional_keys = tuple(
            k for k in ("old_logprobs", "rollout_logprobs", *kl) if k not in self.required_keys
        )
        # entropy is always reported; it needs a graph only when it is in the loss
        self.request = TokenRequest(logprobs=True, entropy=True, entropy_grad=a.entropy_coeff != 0)

    def micro_batch_weights(self, mini: Batch, micro_batches: list[Batch]) -> list[float]:
        return micro_batch_weights(mini, micro_batches, per_token=not self.mode.per_sequence)

    def loss(self, mb: Batch, out: TokenOutputs) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb["response_mask"].float()
        # without old_logprobs the update is on-policy: ratio exactly 1, the plain policy gradient
        old = mb["old_logprobs"] if "old_logprobs" in mb else out.logprobs.detach()
        advantages, rollout_metrics = mb["advantages"], {}
        if self.correction is not None and "rollout_logprobs" in mb:  # declared required: always, in runs
            advantages, mask, rollout_metrics = correct_for_rollout(
                self.correction, old, mb["rollout_logprobs"], advantages, mask
            )
        pg_loss, metrics = self.policy_loss(old, out.logprobs, advantages, mask)
        entropy_loss = agg_loss(out.entropy, mask, self.mode, self.norm_length)
        loss = pg_loss - self.entropy_coeff * entropy_loss
        metrics = dict(metrics, **{"actor/pg_loss": pg_loss.detach(), "actor/entropy": entropy_loss.detach()})
        metrics.update(rollout_metrics)
        if self.kl_loss_coef is not None:
            kl = kl_penalty(out.logprobs, mb["ref_logprobs"], self.kl_estimator)
            kl_loss = agg_loss(kl, mask, self.mode, self.norm_length)
            loss = loss + self.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        return loss, metrics


def correct_for_rollout(
    c: RolloutCorrectionConfig, old: Tensor, rollout: Tensor, advantages: Tensor, mask: Tensor
):
    """Mismatch metrics, then truncated IS weights on the advantages (every surrogate term scales
    with a non-negative weight, so weighting A weights the token's loss) and rejection on the mask.
    Returns (advantages, mask, metrics)."""
    metrics = mismatch_metrics(old, rollout, mask)
    log_ratio = rollout_log_ratio(old, rollout, mask)
    if c.rollout_is is not None:
        weights = rollout_is_weights(
            log_ratio, mask, CorrectionLevel(c.rollout_is.value), c.rollout_is_threshold
        )
        advantages = advantages * weights
        metrics["rollout_corr/is_weight_mean"] = (weights.sum() / mask.sum().clamp(min=1)).detach()
    if c.rollout_rs is not None:
        lower = c.rollout_rs_threshold_lower or 1.0 / c.rollout_rs_threshold
        keep = rollout_rs_mask(
            log_ratio, mask, CorrectionLevel(c.rollout_rs.value), c.rollout_rs_threshold, lower
        )
        metrics["rollout_corr/rs_rejected_frac_mean"] = (1 - keep.sum() / mask.sum().clamp(min=1)).detach()
        mask = keep
    return advantages, mask, metrics


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


@register_objective("grpo")
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


@register_objective("dr_grpo", validate=_check_dr_grpo)
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


@register_objective("gspo", validate=_check_gspo)
def gspo(cfg: DagrlConfig) -> PolicyGradientObjective:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one length-normalised
    importance ratio per response, clipped per response (no dual-clip)."""
    low, high = _clip_range(cfg)
    return PolicyGradientObjective(
        cfg, partial(compute_gspo_policy_loss, clip_ratio_low=low, clip_ratio_high=high)
    )


def _check_dapo(cfg: DagrlConfig) -> None:
    """DAPO's token-level loss (§3.3) is part of the algorithm: every token of the batch weighs the
    same, so long responses are not diluted (the preset sets it)."""
    mode = cfg.actor_rollout_ref.actor.loss_agg_mode
    if mode != LossAggMode.token_mean:
        raise ConfigError(
            f"{A}.loss_agg_mode",
            mode.value,
            "DAPO's loss is a mean over every token of the batch: use token-mean (the preset"
            " algorithm=dapo sets it), or algorithm=grpo with dynamic sampling for another mode",
        )


@register_objective("dapo", validate=_check_dapo)
def dapo(cfg: DagrlConfig) -> PolicyGradientObjective:
    """DAPO (Yu et al. 2025, arXiv 2503.14476): GRPO's clipped surrogate with clip-higher
    (clip_ratio_high > clip_ratio_low) and the token-level loss; dynamic sampling and the
    overlong penalty are the trainer's and the advantage node's (algorithm.filter_groups,
    reward.overlong_buffer)."""
    return PolicyGradientObjective(cfg, _ppo_clip(cfg))
