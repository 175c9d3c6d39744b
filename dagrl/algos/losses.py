"""Policy-gradient losses, KL estimators and log-prob helpers: pure tensor functions.

Shapes: ``B`` = batch of responses, ``T`` = response length (padded), ``V`` = vocabulary size.
Masks are 0/1 tensors of shape ``[B, T]`` (bool, int or float).
"""

from __future__ import annotations

from enum import Enum, EnumMeta

import torch
from torch import Tensor

# Bounds on log-ratios before exp() and on the k3 estimate, as verl uses: a token whose
# probability moved by e^20 is already garbage, and inf/nan would poison the whole batch.
_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0


class _ByNameOrValue(EnumMeta):
    """`Enum[key]` finds a member by name or, failing that, by value. OmegaConf turns config strings
    into enum members with `Enum[key]`, and verl's spellings ("token-mean") are not identifiers."""

    def __getitem__(cls, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            try:
                return cls(key)
            except ValueError:
                raise KeyError(key) from None


class LossAggMode(str, Enum, metaclass=_ByNameOrValue):
    """How a ``[B, T]`` per-token loss becomes a scalar (see ``agg_loss``). Config values may be
    the names (``token_mean``) or verl's spellings (``token-mean``)."""

    token_mean = "token-mean"
    seq_mean_token_sum = "seq-mean-token-sum"
    seq_mean_token_mean = "seq-mean-token-mean"
    seq_mean_token_sum_norm = "seq-mean-token-sum-norm"

    @property
    def per_sequence(self) -> bool:
        """True when the scalar is a mean over responses (each response weighs the same)."""
        return self != LossAggMode.token_mean


class KLEstimator(str, Enum):
    """Monte-Carlo estimators of KL(pi || pi_ref) from Schulman (2020), "Approximating KL divergence".

    verl's names are aliases of the same members, so configs written for verl keep working."""

    k1 = "k1"
    k2 = "k2"
    k3 = "k3"
    abs = "abs"
    kl = "k1"  # verl: kl = k1
    mse = "k2"  # verl: mse = k2
    low_var_kl = "k3"  # verl: low_var_kl = k3

    @classmethod
    def parse(cls, name: str | KLEstimator) -> KLEstimator:
        """A member from a canonical name or one of verl's aliases ("kl", "mse", "low_var_kl")."""
        if isinstance(name, cls):
            return name
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"unknown KL estimator {name!r}; use one of {sorted(cls.__members__)}") from None


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1; 0 where the mask is empty.

    Args:
        x: any shape, e.g. ``[B, T]``.
        mask: 0/1, same shape as ``x``.
        dim: reduce over this dim only; ``None`` reduces over everything (scalar).
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: LossAggMode, norm_length: int | None = None) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    - token-mean: every valid token weighs the same (DAPO, Yu et al. 2025, §3.3).
    - seq-mean-token-sum: mean over responses of the per-response token sum.
    - seq-mean-token-mean: mean over responses of the per-response token mean (original GRPO,
      Shao et al. 2024). Responses with an empty mask contribute 0.
    - seq-mean-token-sum-norm: Dr. GRPO's constant-length form, see ``seq_mean_token_sum_norm``;
      needs ``norm_length``.
    """
    mask = mask.to(loss_mat.dtype)
    match LossAggMode(mode):
        case LossAggMode.token_mean:
            return masked_mean(loss_mat, mask)
        case LossAggMode.seq_mean_token_sum:
            return (loss_mat * mask).sum(-1).mean()
        case LossAggMode.seq_mean_token_mean:
            return masked_mean(loss_mat, mask, dim=-1).mean()
        case LossAggMode.seq_mean_token_sum_norm:
            assert norm_length is not None, "seq-mean-token-sum-norm needs the constant norm_length"
            return seq_mean_token_sum_norm(loss_mat, mask, norm_length)
    raise AssertionError(f"unhandled LossAggMode {mode}")


def seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, norm_length: int) -> Tensor:
    """Dr. GRPO's aggregation (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1):
    ``mean_b(sum_t loss[b, t] * mask[b, t]) / norm_length``.

    GRPO's per-response ``1 / |o_i|`` makes a token of a short response weigh more than one of a
    long response: short correct answers are pushed harder, long wrong ones are punished less,
    and responses grow. Dividing every response's token sum by the same constant (the maximum
    response length) removes that length bias while keeping the loss on the scale of a token
    mean. verl's mode of the same name divides the sum over responses (not their mean) by the
    padded width; here the normaliser is the configured maximum, constant for the whole run.

    Args:
        loss_mat: ``[B, T]`` per-token loss.
        mask: ``[B, T]`` 0/1.
        norm_length: the constant normaliser (``data.max_response_length``), > 0.

    Returns:
        Scalar.
    """
    return (loss_mat * mask.to(loss_mat.dtype)).sum(-1).mean() / norm_length


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020).

    With ``d = logprobs - ref_logprobs``:
    k1 = d (unbiased, high variance); k2 = d^2 / 2; abs = |d|;
    k3 = exp(-d) + d - 1 (unbiased, low variance, >= 0). For k3 the log-ratio is clamped to
    [-20, 20] before exp and the result to [-10, 10], as verl's ``low_var_kl``.

    Args:
        logprobs, ref_logprobs: ``[B, T]`` log-probs of the sampled tokens under pi and pi_ref.

    Returns:
        ``[B, T]`` per-token KL estimate (unmasked).
    """
    diff = logprobs - ref_logprobs
    match KLEstimator(estimator):
        case KLEstimator.k1:
            return diff
        case KLEstimator.k2:
            return 0.5 * diff.square()
        case KLEstimator.abs:
            return diff.abs()
        case KLEstimator.k3:
            log_ratio = (-diff).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
            k3 = log_ratio.exp() - log_ratio - 1
            return k3.clamp(-_K3_CLAMP, _K3_CLAMP)
    raise AssertionError(f"unhandled KLEstimator {estimator}")


def compute_policy_loss(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    loss_agg_mode: LossAggMode,
    clip_ratio_c: float | None = 3.0,
    norm_length: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization Algorithms").

    ``ratio = exp(logprobs - old_logprobs)`` and per token
    ``loss = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))``;
    the asymmetric range is DAPO's clip-higher (Yu et al. 2025). When ``clip_ratio_c`` is set,
    tokens with ``A < 0`` are further capped at ``-A * clip_ratio_c`` (dual-clip PPO, Ye et al.
    2020), so a huge ratio on a bad token cannot blow up the loss.

    Args:
        old_logprobs: ``[B, T]`` log-probs under the policy that sampled the data (no grad).
        logprobs: ``[B, T]`` log-probs under the current policy (with grad).
        advantages: ``[B, T]``.
        response_mask: ``[B, T]`` 0/1.
        clip_ratio_low, clip_ratio_high: the ratio is clipped to [1 - low, 1 + high].
        loss_agg_mode: how token losses become a scalar, see ``agg_loss``.
        clip_ratio_c: dual-clip bound (> 1), or None to disable dual-clip.
        norm_length: the constant normaliser of seq-mean-token-sum-norm (Dr. GRPO), else unused.

    Returns:
        The scalar loss, and metrics as detached 0-dim tensors, so the caller decides when to
        synchronise with the device (masked token means): ``actor/pg_clipfrac`` (clipped
        branch strictly larger), ``actor/ppo_kl`` (mean of old - new log-prob),
        ``actor/pg_clipfrac_lower`` (dual-clip active).
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c = {clip_ratio_c}: dual-clip needs a bound > 1, or None to disable")

    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(pg_losses, dtype=torch.bool)
    if clip_ratio_c is not None:
        dual_bound = -advantages * clip_ratio_c
        dual_active = (advantages < 0) & (pg_losses > dual_bound)
        pg_losses = torch.where(dual_active, dual_bound, pg_losses)

    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, norm_length)
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
            "actor/ppo_kl": masked_mean(-log_ratio, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(dual_active.float(), response_mask),
        }
    return loss, metrics


def logprob_temperature(sampling_temperature: float) -> float:
    """The temperature the trainer divides logits by when it scores the rollout's tokens.

    Sampling at T > 0 draws from softmax(z / T): the policy being optimised is that distribution,
    so the log-probs (old, current, reference) use the same T. T = 0 is greedy decoding (argmax):
    the rollout is a deterministic function of the policy and there is no sampling distribution to
    match, so the log-probs are those of the model itself, softmax(z) (T = 1). The PPO/GRPO ratio
    compares two log-probs taken at that same T, so it stays exact; the hf and vLLM rollouts report
    greedy tokens' log-probs at T = 1 too (vLLM's processed log-probs skip the temperature for
    greedy requests), so the rollout-vs-trainer mismatch metrics compare like with like.
    """
    return sampling_temperature if sampling_temperature > 0 else 1.0


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-prob of ``labels`` under ``softmax(logits)``: ``logits[label] - logsumexp(logits)``.

    Computed in float32 one row at a time, so only a ``[T, V]`` float32 copy of the logits is
    alive at once instead of a full ``[B, T, V]`` log_softmax. Differentiable.

    Args:
        logits: ``[B, T, V]`` any float dtype.
        labels: ``[B, T]`` long token ids.

    Returns:
        ``[B, T]`` float32.
    """
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row_logits = row_logits.float()
        picked = row_logits.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` per position: ``logsumexp(l) - sum(softmax(l) * l)``.

    Float32, one row at a time (see ``logprobs_from_logits``). Differentiable.

    Args:
        logits: ``[B, T, V]`` any float dtype.

    Returns:
        ``[B, T]`` float32, in nats.
    """
    rows = []
    for row_logits in logits:
        row_logits = row_logits.float()
        probs = torch.softmax(row_logits, dim=-1)
        rows.append(torch.logsumexp(row_logits, dim=-1) - (probs * row_logits).sum(-1))
    return torch.stack(rows)
