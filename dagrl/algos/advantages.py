"""Advantage estimators: pure tensor functions, no config objects.

Shapes: ``B`` = number of sampled responses in the batch, ``T`` = response length (padded).
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def compute_grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    response_mask: Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024, "DeepSeekMath", §4.1.2).

    Each response is scored against the other responses sampled for the same prompt:
    ``adv = (score - mean_g) / (std_g + eps)`` or ``score - mean_g`` when ``norm_by_std`` is False
    (the "Dr. GRPO" variant, Liu et al. 2025). ``std_g`` is the unbiased (n - 1) std, as
    ``torch.std`` and verl compute it. A group of identical scores gets advantage 0.

    A group of size 1 has no peers to compare with; like verl we then use mean 0 and std 1,
    so its advantage is the raw score (divided by ``1 + eps``).

    Args:
        scores: ``[B]`` scalar reward per response.
        group_ids: ``[B]`` long; equal ids mark responses to the same prompt (any values, any order).
        response_mask: ``[B, T]`` 1 on response tokens, 0 on padding.
        norm_by_std: divide by the group std.
        eps: added to the std so zero-variance groups do not divide by zero.

    Returns:
        ``[B, T]`` float32 advantage, the same for every token of a response, 0 where masked.
    """
    scores = scores.float()
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts = counts.to(scores.dtype)
    sums = torch.zeros_like(counts).index_add_(0, inverse, scores)
    means = sums / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    stds = (sq_dev / (counts - 1).clamp(min=1)).sqrt()

    singleton = counts == 1
    means = torch.where(singleton, torch.zeros_like(means), means)
    stds = torch.where(singleton, torch.ones_like(stds), stds)

    adv = scores - means[inverse]
    if norm_by_std:
        adv = adv / (stds[inverse] + eps)
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)
