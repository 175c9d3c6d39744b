"""PPO's critic-side math (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"):
generalized advantage estimation and the clipped value loss. Pure tensor functions, no config.

Used by PPO with a critic (`algorithm=ppo`): the `gae` estimator (objectives/advantage.py) and the
critic's update (objectives/value.py, backends/torch/critic.py).
What is left out, and why: value-loss variants other than PPO's clip (the clip is what verl and
the paper use by default). Masked tokens pass the running advantage and next value through, so a
multi-turn row's observations do not cut its returns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dagrl.algos.advantages import masked_whiten
from dagrl.algos.losses import LossAggMode, agg_loss, masked_mean


@torch.no_grad()
def compute_gae_advantages(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation", eq. 16), as verl's ``gae`` estimator.

        δ_t = r_t + γ V_{t'} - V_t          (t' the row's next policy token; V = 0 past the last)
        A_t = δ_t + γ λ A_{t'}
        returns_t = A_t + V_t               (the critic's regression target)

    Masked tokens (padding, a multi-turn row's observations) are skipped: the next value and the
    running advantage pass through them unchanged. The advantages are then whitened over the
    batch's policy tokens (``masked_whiten``); the returns are not.

    Args:
        token_rewards: ``[B, T]`` per-token rewards (score on the last policy token, minus KL).
        values: ``[B, T]`` the critic's value of each response position.
        response_mask: ``[B, T]`` 1 on the policy's tokens.
        gamma: discount per policy token.
        lam: GAE's λ (1: Monte-Carlo returns minus the value; 0: one-step TD errors).

    Returns:
        (advantages ``[B, T]`` whitened, returns ``[B, T]``), both 0 where masked.
    """
    mask = response_mask.float()
    rewards, values = token_rewards.float(), values.float()
    rows, width = rewards.shape
    next_value = torch.zeros(rows, dtype=rewards.dtype, device=rewards.device)
    running = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(width)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        on = mask[:, t] > 0
        running = torch.where(on, delta + gamma * lam * running, running)
        next_value = torch.where(on, values[:, t], next_value)
        advantages[:, t] = running
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns


def compute_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: LossAggMode = LossAggMode.token_mean,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss (verl's ``critic.cliprange_value``): the new value may move at most
    ``cliprange_value`` from the value at sampling time before the squared error stops rewarding it,

        loss = 0.5 · agg(max((V - R)², (clip(V, V_old - c, V_old + c) - R)²))

    Args:
        values: ``[B, T]`` the critic's current values (with their graph).
        old_values: ``[B, T]`` its values when the batch was sampled.
        returns: ``[B, T]`` the targets (``compute_gae_advantages``).
        response_mask: ``[B, T]`` 1 on the policy's tokens.
        cliprange_value: the clip range c.
        loss_agg_mode: how the per-token losses become one number.

    Returns:
        (scalar loss, {"critic/vf_clipfrac": share of tokens where the clipped error was larger}).
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped_error, clipped_error), response_mask, loss_agg_mode)
    clipfrac = masked_mean((clipped_error > unclipped_error).float(), response_mask)
    return loss, {"critic/vf_clipfrac": clipfrac.detach()}
