"""Rewards written only in tests/: one that returns NaN for some rows, one that raises on some.
`external_plugins=[tests/plugins/nan_reward.py]` and `+reward.functions=[{name: nan_on_odd}]`."""

import math

from dagrl.rewards import register_reward
from dagrl.rewards.arith import arith_reward


@register_reward("nan_on_odd")
def nan_on_odd(solution_str: str, ground_truth: str, extra_info: dict) -> float:
    """The arithmetic reward, but NaN on rows whose data index is odd (a broken scorer)."""
    if extra_info.get("index", 0) % 2:
        return math.nan
    return arith_reward(solution_str, ground_truth, extra_info)


@register_reward("raise_on_seven")
def raise_on_seven(solution_str: str, ground_truth: str, extra_info: dict) -> float:
    """Raises on the rows whose data index ends in 7."""
    if extra_info.get("index", 0) % 10 == 7:
        raise ValueError("cannot parse the answer")
    return arith_reward(solution_str, ground_truth, extra_info)
