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
    adv = _group_normalise(scores.float(), group_ids, norm_by_std, eps)
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


def _group_normalise(values: Tensor, groups: Tensor, norm_by_std: bool, eps: float) -> Tensor:
    """``(v - mean_g) / (std_g + eps)`` (or ``v - mean_g``) over the values of each group; a group
    of one value gets mean 0 and std 1, as in ``compute_grpo_advantages``. values, groups: ``[N]``."""
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    counts = counts.to(values.dtype)
    means = torch.zeros_like(counts).index_add_(0, inverse, values) / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, inverse, (values - means[inverse]) ** 2)
    stds = (sq_dev / (counts - 1).clamp(min=1)).sqrt()
    singleton = counts == 1
    means = torch.where(singleton, torch.zeros_like(means), means)
    stds = torch.where(singleton, torch.ones_like(stds), stds)
    out = values - means[inverse]
    return out / (stds[inverse] + eps) if norm_by_std else out


def played_turns(turn_ids: Tensor, num_turns: int) -> Tensor:
    """``[B, K]`` bool: turn k of row b was played (some response token belongs to it)."""
    count = (turn_ids.max(dim=1).values + 1).clamp(min=0)
    return torch.arange(num_turns, device=turn_ids.device)[None] < count[:, None]


@torch.no_grad()
def compute_turn_advantages(
    turn_rewards: Tensor,
    turn_ids: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Per-turn credit for multi-turn episodes: GRPO's process supervision (Shao et al. 2024,
    "DeepSeekMath", §4.1.3) with an environment's turns as the steps.

    Every played turn's reward is normalised against all the played turns' rewards of the same
    group, ``r̃ = (r - mean_g) / (std_g + eps)`` (``r - mean_g`` without ``norm_by_std``), and a
    policy token of turn ``k`` gets the sum of the normalised rewards of turns ``k, k+1, ...`` of
    its episode (its reward-to-go): a turn is credited with what follows it, never with what came
    before. Turns not played (past an episode's end) are left out of the statistics.

    Args:
        turn_rewards: ``[B, K]`` the environment's reward after each assistant turn.
        turn_ids: ``[B, T]`` long, the turn each response token belongs to (its observation too),
            -1 on padding.
        response_mask: ``[B, T]`` 1 on the policy's tokens.
        group_ids: ``[B]`` long; equal ids mark episodes of the same prompt.

    Returns:
        ``[B, T]`` float32, 0 off the policy's tokens.
    """
    rows, num_turns = turn_rewards.shape
    played = played_turns(turn_ids, num_turns)
    groups = group_ids[:, None].expand(rows, num_turns)[played]
    normalised = torch.zeros((rows, num_turns), dtype=torch.float32, device=turn_rewards.device)
    if played.any():
        normalised[played] = _group_normalise(turn_rewards.float()[played], groups, norm_by_std, eps)
    to_go = normalised.flip(1).cumsum(1).flip(1)  # [B, K]: sum over turns k..K-1
    return to_go.gather(1, turn_ids.clamp(min=0)) * response_mask.float()


def place_turn_rewards(turn_rewards: Tensor, turn_ids: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, K]`` per-turn rewards -> ``[B, T]``, each on the last policy token of its turn (turns
    without a policy token are dropped). turn_ids ``[B, T]``, response_mask ``[B, T]``."""
    rows, width = turn_ids.shape
    policy = response_mask.bool() & (turn_ids >= 0)
    columns = torch.arange(width, device=turn_ids.device).expand(rows, width)
    # last column of each (row, turn): scatter the columns with amax into [B, K]
    last = torch.full(turn_rewards.shape, -1, dtype=torch.long, device=turn_ids.device)
    last = last.scatter_reduce(1, turn_ids.clamp(min=0), torch.where(policy, columns, -1), "amax")
    out = torch.zeros((rows, width), dtype=torch.float32, device=turn_ids.device)
    b, k = (last >= 0).nonzero(as_tuple=True)
    out[b, last[b, k]] = turn_rewards.float()[b, k]
    return out
