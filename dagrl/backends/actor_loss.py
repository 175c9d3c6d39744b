"""What every train backend computes the same way: the actor's loss on a micro-batch, the
micro-batch weights of a mini-batch, and weight buckets for sync. The config-facing layer over
`dagrl.algos`, whose functions stay free of config objects."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from dagrl.algos import KLEstimator, LossAggMode, agg_loss, compute_policy_loss, kl_penalty
from dagrl.algos.rollout_correction import (
    CorrectionLevel,
    mismatch_metrics,
    rollout_is_weights,
    rollout_log_ratio,
    rollout_rs_mask,
)
from dagrl.config.schema import RolloutCorrectionConfig
from dagrl.core.batch import Batch


def actor_loss(
    actor,
    mb: Batch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    mode: LossAggMode,
    correction: RolloutCorrectionConfig | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip policy loss - entropy bonus (+ KL to the reference) of one micro-batch.

    actor: ActorConfig. logprobs, entropy: [B, R] under the current policy, on their device; the
    batch's old_logprobs, advantages, response_mask (and ref_logprobs) are moved there. Without
    old_logprobs (on-policy, recompute_old_logprobs=false) the current log-probs, detached, stand
    in: the ratio is 1 and its gradient the plain policy gradient. correction: the rollout
    correction settings when the batch's rollout_logprobs are real (None: they are not used).
    Metrics are detached 0-dim tensors (no device sync here).
    """
    dev = logprobs.device
    mask = mb["response_mask"].to(dev).float()
    old = mb["old_logprobs"].to(dev) if "old_logprobs" in mb else logprobs.detach()
    advantages = mb["advantages"].to(dev)
    rollout_metrics = {}
    if correction is not None and "rollout_logprobs" in mb:
        advantages, mask, rollout_metrics = _correct_for_rollout(
            correction, old, mb["rollout_logprobs"].to(dev), advantages, mask
        )
    pg_loss, metrics = compute_policy_loss(
        old,
        logprobs,
        advantages,
        mask,
        clip_ratio_low=actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio,
        clip_ratio_high=actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio,
        loss_agg_mode=mode,
        clip_ratio_c=actor.clip_ratio_c,
    )
    entropy_loss = agg_loss(entropy, mask, mode)
    loss = pg_loss - actor.entropy_coeff * entropy_loss
    metrics = dict(metrics, **{"actor/pg_loss": pg_loss.detach(), "actor/entropy": entropy_loss.detach()})
    metrics.update(rollout_metrics)
    if actor.use_kl_loss:
        kl = kl_penalty(logprobs, mb["ref_logprobs"].to(dev), KLEstimator.parse(actor.kl_loss_type))
        kl_loss = agg_loss(kl, mask, mode)
        loss = loss + actor.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach()
    return loss, metrics


def _correct_for_rollout(c, old, rollout, advantages, mask):
    """Mismatch metrics, then truncated IS weights on the advantages (the PPO terms scale with a
    non-negative weight, so weighting A weights the token's loss) and rejection on the mask."""
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


def rollout_correction(cfg) -> RolloutCorrectionConfig | None:
    """The correction settings when the rollout's log-probs are real, else None (not used)."""
    if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        return None
    return cfg.algorithm.rollout_correction


def micro_batch_weights(mini: Batch, micro_batches: list[Batch], mode: LossAggMode) -> list[float]:
    """Weights that make the micro-batches' accumulated gradient that of the mini-batch's loss:
    token share for token-mean, row share for the sequence means."""
    if mode == LossAggMode.TOKEN_MEAN:
        total = float(mini["response_mask"].sum().clamp(min=1))
        return [float(mb["response_mask"].sum()) / total for mb in micro_batches]
    return [len(mb) / len(mini) for mb in micro_batches]


def weight_buckets(
    named: Iterable[tuple[str, torch.Tensor]], limit_bytes: int, to_cpu: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """(name, tensor) pairs grouped into dicts of about limit_bytes (one tensor may exceed it)."""
    bucket, size = {}, 0
    for name, tensor in named:
        t = tensor.detach().cpu() if to_cpu else tensor.detach()
        if bucket and size + t.numel() * t.element_size() > limit_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = t
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket
