"""DAPO's reward shaping and group filter (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", arXiv 2503.14476): pure tensor functions, no config objects.

What is here: the soft overlong punishment (§3.4, ``overlong_penalty``) and dynamic sampling's
test of which groups carry a gradient (§3.2, ``varied_groups``). Clip-higher (§3.1) is the
policy loss's ``clip_ratio_low`` / ``clip_ratio_high`` and the token-level loss (§3.3) its
``token-mean`` aggregation (dagrl/algos/losses.py); the refill of the batch is the trainer's
(dagrl/trainer/dynamic_sampling.py). Left out: overlong *filtering* (§3.4, masking truncated
responses out of the loss), which the paper reports as a stabiliser it replaces with the
soft punishment.
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_length: int, buffer_length: int, penalty_factor: float) -> Tensor:
    """Soft overlong punishment (DAPO §3.4, eq. 13; verl's ``overlong_buffer``): 0 for a response
    of at most ``max_length - buffer_length`` tokens, then falling linearly to ``-penalty_factor``
    at ``max_length`` (and below it past ``max_length``, which a rollout does not produce).

        expected = max_length - buffer_length
        penalty  = min(0, -(length - expected) / buffer_length * penalty_factor)

    Args:
        lengths: ``[B]`` response lengths in tokens.
        max_length: the response limit (data.max_response_length).
        buffer_length: the last tokens before the limit over which the penalty grows (> 0).
        penalty_factor: the penalty at the limit.

    Returns:
        ``[B]`` float32, <= 0, added to each response's reward.
    """
    excess = lengths.float() - (max_length - buffer_length)
    return torch.clamp(-excess / buffer_length * penalty_factor, max=0.0)


def varied_groups(values: Tensor, group_ids: Tensor) -> Tensor:
    """Rows whose group has more than one distinct value (DAPO §3.2, dynamic sampling): a group
    whose responses all got the same reward has advantage 0 under a group baseline and adds no
    gradient. A group of one row is kept (verl's choice: no peers, nothing to compare).

    Args:
        values: ``[B]`` the metric each row is compared on (its reward).
        group_ids: ``[B]`` long; equal ids mark responses to the same prompt.

    Returns:
        ``[B]`` bool, True on the rows of groups to keep.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    values = values.double()
    groups = len(counts)
    highest = torch.full((groups,), -torch.inf, dtype=values.dtype).scatter_reduce(0, inverse, values, "amax")
    lowest = torch.full((groups,), torch.inf, dtype=values.dtype).scatter_reduce(0, inverse, values, "amin")
    keep = (highest > lowest) | (counts == 1)
    return keep[inverse]
