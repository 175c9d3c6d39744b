"""Reward for dagrl's built-in arithmetic task: the response must be exactly the integer answer."""

from __future__ import annotations

import re

from dagrl.rewards.registry import register_reward

_INTEGER = re.compile(r"-?\d+")


@register_reward("arith")
def arith_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the stripped response is an integer equal to ``int(ground_truth)``, else 0.0.

    Deliberately strict (no words, no trailing period) so the tiny end-to-end run has a sharp,
    learnable signal.
    """
    response = solution_str.strip()
    if not _INTEGER.fullmatch(response):
        return 0.0
    return 1.0 if int(response) == int(ground_truth.strip()) else 0.0
