"""Rollout-vs-trainer mismatch: importance weights, rejection masks and the metrics that show it.

The rollout engine (vLLM: its own kernels, bf16 sampling, different batching) and the trainer
compute slightly different probabilities for the same tokens, so the samples are off-policy even
when the weights are identical; with `overlap_steps=1` they also come from weights one step old.
Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
You Off-Policy RL Training") reweights each token's policy-gradient term by
w = min(π_old / π_rollout, C); rejection sampling (verl's `rollout_rs`) drops the tokens or whole
sequences whose ratio leaves [lower, upper]. Names follow verl's `algorithm.rollout_correction.*`.

What is left out: verl's batch normalisation of the weights and its per-token "veto" (a sequence
is rejected when any token's ratio falls below a floor); `rollout_rs=token` with a tight lower
bound gives a similar effect token by token.

Shapes: ``B`` responses, ``T`` response length; masks are 0/1 ``[B, T]``.
"""

from __future__ import annotations

from enum import Enum

from torch import Tensor

_LOG_RATIO_CLAMP = 20.0  # as the policy loss: e^20 is already garbage, inf would poison the batch


class CorrectionLevel(str, Enum):
    """Where a ratio is taken: per token, per sequence (product of token ratios), or the
    sequence's geometric mean (length-normalised; rejection sampling only)."""

    token = "token"
    sequence = "sequence"
    geometric = "geometric"


def rollout_log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log(π_old / π_rollout) per token, 0 outside the mask, clamped to ±20.

    Args:
        old_logprobs: ``[B, T]`` trainer log-probs of the sampled tokens (before the update).
        rollout_logprobs: ``[B, T]`` the rollout engine's log-probs of the same tokens.
        mask: ``[B, T]`` response mask.
    """
    diff = (old_logprobs.float() - rollout_logprobs.float()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return diff * mask.float()


def _level_log_ratio(log_ratio: Tensor, mask: Tensor, level: CorrectionLevel) -> Tensor:
    """``[B, T]`` log-ratio at `level`, broadcast back over each sequence's tokens."""
    if level == CorrectionLevel.token:
        return log_ratio
    seq = log_ratio.sum(-1, keepdim=True)
    if level == CorrectionLevel.geometric:
        seq = seq / mask.float().sum(-1, keepdim=True).clamp(min=1)
    return seq.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).expand_as(log_ratio)


def rollout_is_weights(log_ratio: Tensor, mask: Tensor, level: CorrectionLevel, threshold: float) -> Tensor:
    """Truncated importance weights ``[B, T]`` = min(ratio, threshold) at `level`, 0 off the mask.

    No gradient flows through them: they rescale the policy-gradient term, they are not optimised.

    Args:
        log_ratio: ``[B, T]`` from `rollout_log_ratio`.
        level: token (w_t = π_old(y_t)/π_rollout(y_t)) or sequence (w = Π_t w_t, one per row).
        threshold: C, the truncation (verl's default 2.0).
    """
    assert level in (CorrectionLevel.token, CorrectionLevel.sequence), "IS weights: token or sequence"
    weights = _level_log_ratio(log_ratio, mask, level).exp().clamp(max=threshold)
    return (weights * mask.float()).detach()


def rollout_rs_mask(
    log_ratio: Tensor, mask: Tensor, level: CorrectionLevel, upper: float, lower: float
) -> Tensor:
    """0/1 ``[B, T]``: 1 where the ratio at `level` lies in [lower, upper] (and the mask is 1).

    Token level drops single tokens; sequence and geometric levels drop whole responses.
    """
    ratio = _level_log_ratio(log_ratio, mask, level).exp()
    keep = (ratio >= lower) & (ratio <= upper)
    return keep.float() * mask.float()


def mismatch_metrics(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Token-level mismatch over the masked tokens: |Δ log p| mean and max, ratio min / mean / max.

    0-dim detached tensors (no device sync). Keys end in `_mean`, `_max` or `_min`, which tells a
    caller merging several micro-batches how to combine them (`dagrl.core.metrics`).
    """
    m = mask.bool()
    if not m.any():
        zero = old_logprobs.new_zeros(())
        return {k: zero for k in _METRIC_KEYS}
    diff = (old_logprobs.float() - rollout_logprobs.float())[m].detach()
    ratio = diff.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    return {
        "rollout_corr/logprob_abs_diff_mean": diff.abs().mean(),
        "rollout_corr/logprob_abs_diff_max": diff.abs().max(),
        "rollout_corr/ratio_mean": ratio.mean(),
        "rollout_corr/ratio_min": ratio.min(),
        "rollout_corr/ratio_max": ratio.max(),
    }


_METRIC_KEYS = (
    "rollout_corr/logprob_abs_diff_mean",
    "rollout_corr/logprob_abs_diff_max",
    "rollout_corr/ratio_mean",
    "rollout_corr/ratio_min",
    "rollout_corr/ratio_max",
)
