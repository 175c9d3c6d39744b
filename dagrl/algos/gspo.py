"""GSPO's policy loss (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071).

GRPO weighs every token by its own importance ratio pi(y_t) / pi_old(y_t), although the reward
and the advantage belong to the whole response; a single noisy token ratio then moves the update,
and clipping drops tokens one by one. GSPO uses one ratio per response, the length-normalised
likelihood ratio, and clips whole responses.

What it leaves out, and why:
- token-level ratios and token-level clipping: replaced by the sequence ratio (the point of GSPO);
- dual-clip (``clip_ratio_c``): the sequence ratio is a geometric mean and stays near 1, and the
  paper clips it to a range of about 1e-4;
- per-token advantages: one advantage per response, as GRPO's estimator produces.

Shapes: ``B`` = batch of responses, ``T`` = response length (padded). Masks are 0/1 ``[B, T]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dagrl.algos.losses import masked_mean

# The sequence log-ratio is a mean of token log-ratios; past e^10 the response is off-policy
# garbage either way, and exp() must not overflow (verl clamps GSPO's log-ratio at 10 too).
_SEQ_LOG_RATIO_CLAMP = 10.0


def compute_gspo_policy_loss(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence-level clipped surrogate of GSPO (Zheng et al. 2025, §4.1).

    Per response i with length ``|y_i|`` (its mask sum):
    ``s_i = exp(sum_t mask * (logprobs - old_logprobs) / |y_i|)`` (the geometric mean of the token
    ratios), ``loss_i = max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_ratio_low, 1 + clip_ratio_high))``
    and the loss is ``mean_i loss_i``. A clipped response gets no gradient; an unclipped one
    ``-A_i * s_i * mean_t grad log pi(y_t)``, every token of it weighted the same.

    Args:
        old_logprobs: ``[B, T]`` log-probs under the policy that sampled the data (no grad).
        logprobs: ``[B, T]`` log-probs under the current policy (with grad).
        advantages: ``[B, T]``, constant over a response's tokens (GRPO's); ``A_i`` is the masked
            mean of row i.
        response_mask: ``[B, T]`` 0/1. A response with no tokens has ``s_i = 1`` and ``A_i = 0``.
        clip_ratio_low, clip_ratio_high: ``s_i`` is clipped to [1 - low, 1 + high]; the paper
            uses 3e-4 and 4e-4.

    Returns:
        The scalar loss, and metrics as detached 0-dim tensors: ``actor/pg_clipfrac`` (share of
        responses whose clipped branch is strictly larger), ``actor/ppo_kl`` (token mean of
        old - new log-prob), ``actor/seq_ratio_mean`` (mean ``s_i``).
    """
    mask = response_mask.to(logprobs.dtype)
    lengths = mask.sum(-1).clamp(min=1)
    token_log_ratio = logprobs - old_logprobs
    seq_log_ratio = (token_log_ratio * mask).sum(-1) / lengths
    seq_ratio = seq_log_ratio.clamp(max=_SEQ_LOG_RATIO_CLAMP).exp()
    seq_adv = masked_mean(advantages, mask, dim=-1)
    unclipped = -seq_adv * seq_ratio
    clipped = -seq_adv * seq_ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": (clipped > unclipped).float().mean(),
            "actor/ppo_kl": masked_mean(-token_log_ratio, mask),
            "actor/seq_ratio_mean": seq_ratio.mean(),
        }
    return loss, metrics
