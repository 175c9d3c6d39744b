"""Reward for tool-using answers: the text after the policy's last tool call must be exactly the
integer answer (the built-in calculator task; reward functions see the policy's turns only)."""

from __future__ import annotations

from dagrl.rewards.arith import arith_reward
from dagrl.rewards.registry import register_reward


@register_reward("final_answer")
def final_answer_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if what follows the last ``</tool_call>`` (the whole text if none) is the integer
    ``ground_truth``, else 0.0."""
    return arith_reward(solution_str.rsplit("</tool_call>", 1)[-1], ground_truth, extra_info)
