"""What every train backend computes the same way: the actor's loss on a micro-batch, the
micro-batch weights of a mini-batch. The config-facing layer over
`dagrl.algos`, whose functions stay free of config objects."""

from __future__ import annotations

import torch

from dagrl.algos import KLEstimator, LossAggMode, agg_loss, compute_policy_loss, kl_penalty
from dagrl.core.batch import Batch


def actor_loss(
    actor, mb: Batch, logprobs: torch.Tensor, entropy: torch.Tensor, mode: LossAggMode
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip policy loss - entropy bonus (+ KL to the reference) of one micro-batch.

    actor: ActorConfig. logprobs, entropy: [B, R] under the current policy, on their device; the
    batch's old_logprobs, advantages, response_mask (and ref_logprobs) are moved there.
    Metrics are detached 0-dim tensors (no device sync here).
    """
    dev = logprobs.device
    mask = mb["response_mask"].to(dev).float()
    pg_loss, metrics = compute_policy_loss(
        mb["old_logprobs"].to(dev),
        logprobs,
        mb["advantages"].to(dev),
        mask,
        clip_ratio_low=actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio,
        clip_ratio_high=actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio,
        loss_agg_mode=mode,
        clip_ratio_c=actor.clip_ratio_c,
    )
    entropy_loss = agg_loss(entropy, mask, mode)
    loss = pg_loss - actor.entropy_coeff * entropy_loss
    metrics = dict(metrics, **{"actor/pg_loss": pg_loss.detach(), "actor/entropy": entropy_loss.detach()})
    if actor.use_kl_loss:
        kl = kl_penalty(logprobs, mb["ref_logprobs"].to(dev), KLEstimator.parse(actor.kl_loss_type))
        kl_loss = agg_loss(kl, mask, mode)
        loss = loss + actor.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach()
    return loss, metrics


def micro_batch_weights(mini: Batch, micro_batches: list[Batch], mode: LossAggMode) -> list[float]:
    """Weights that make the micro-batches' accumulated gradient that of the mini-batch's loss:
    token share for token-mean, row share for the sequence means."""
    if mode == LossAggMode.TOKEN_MEAN:
        total = float(mini["response_mask"].sum().clamp(min=1))
        return [float(mb["response_mask"].sum()) / total for mb in micro_batches]
    return [len(mb) / len(mini) for mb in micro_batches]
