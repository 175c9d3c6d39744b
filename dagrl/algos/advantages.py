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


def _group_means(values: Tensor, groups: Tensor) -> tuple[Tensor, Tensor]:
    """(mean of each value's group, size of that group), both ``[N]``. values, groups: ``[N]``."""
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    counts = counts.to(values.dtype)
    sums = torch.zeros_like(counts).index_add_(0, inverse, values)
    return (sums / counts)[inverse], counts[inverse]


@torch.no_grad()
def compute_rloo_advantages(scores: Tensor, group_ids: Tensor, response_mask: Tensor) -> Tensor:
    """REINFORCE leave-one-out (RLOO; Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline
    for Free!"; Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740, §3.2).

    Each response's baseline is the mean reward of the *other* responses of its group:
    ``adv_i = r_i - (Σ_g r - r_i) / (n - 1) = n / (n - 1) · (r_i - mean_g)``. Unlike GRPO there is
    no division by the std, and the baseline does not contain the response itself, so the
    estimate is unbiased. A group of one has no other response: its advantage is its raw reward
    (verl's choice).

    Args:
        scores: ``[B]`` scalar reward per response.
        group_ids: ``[B]`` long; equal ids mark responses to the same prompt.
        response_mask: ``[B, T]`` 1 on the response tokens.

    Returns:
        ``[B, T]`` float32, the same on every token of a response, 0 where masked.
    """
    scores = scores.float()
    means, counts = _group_means(scores, group_ids)
    adv = torch.where(counts > 1, (scores - means) * counts / (counts - 1).clamp(min=1), scores)
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(v - mean) / sqrt(var + eps)`` with the mean and the unbiased (n - 1) variance taken over
    every masked entry of the batch (as verl's ``masked_whiten``); 0 where masked.
    values, mask: ``[B, T]``."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = (((values - mean) ** 2) * mask).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


@torch.no_grad()
def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """Return-to-go of every policy token, ``G_t = r_t + γ · G_{t'}`` with ``t'`` the next policy
    token of the row: masked tokens (padding, a multi-turn row's observations) are skipped, carrying
    the return through unchanged, so a final reward reaches every earlier turn. On single-turn rows
    this equals verl's REINFORCE++ returns (which reset at the first masked token).

    Args:
        token_rewards: ``[B, T]`` reward of each token (the score on the last policy token, minus a
            per-token KL penalty when it is in the reward).
        response_mask: ``[B, T]`` 1 on the policy's tokens.
        gamma: discount per policy token (1.0: every token gets the rest of the row's reward).

    Returns:
        ``[B, T]`` float32, 0 where masked.
    """
    mask = response_mask.float()
    rewards = token_rewards.float() * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        step = rewards[:, t] + gamma * running
        running = torch.where(mask[:, t] > 0, step, running)
        returns[:, t] = running
    return returns * mask


@torch.no_grad()
def compute_reinforce_plus_plus_advantages(
    token_rewards: Tensor, response_mask: Tensor, gamma: float
) -> Tensor:
    """REINFORCE++ (Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to
    Both Prompt and Reward Models", arXiv 2501.03262, §3): the discounted return of every token
    (``discounted_returns``; the paper puts the per-token KL to the reference into the token
    rewards), whitened over the whole batch (global advantage normalisation): no critic and no
    group, so it also runs with rollout.n = 1.

    Args:
        token_rewards: ``[B, T]`` per-token rewards.
        response_mask: ``[B, T]`` 1 on the policy's tokens.
        gamma: discount per policy token.

    Returns:
        ``[B, T]`` float32, mean 0 and (unbiased) variance 1 over the masked tokens, 0 elsewhere.
    """
    return masked_whiten(discounted_returns(token_rewards, response_mask, gamma), response_mask)


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantages(
    scores: Tensor, group_ids: Tensor, response_mask: Tensor
) -> Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262, §3.2): each response's reward
    minus its group's mean (a group of one keeps its reward), put on every token and then whitened
    over the whole batch, as verl's ``reinforce_plus_plus_baseline``: GRPO's baseline without
    GRPO's per-group std, whose small values blow up nearly-solved prompts.

    Args:
        scores: ``[B]`` scalar reward per response (with KL in the reward: its sum over tokens).
        group_ids: ``[B]`` long; equal ids mark responses to the same prompt.
        response_mask: ``[B, T]`` 1 on the response tokens.

    Returns:
        ``[B, T]`` float32, whitened over the masked tokens, 0 elsewhere.
    """
    scores = scores.float()
    means, counts = _group_means(scores, group_ids)
    centred = torch.where(counts > 1, scores - means, scores)
    mask = response_mask.float()
    return masked_whiten(centred.unsqueeze(-1) * mask, mask)
