"""Reward functions and their composition.

Importing this package registers the built-in rewards: ``gsm8k``, ``math``, ``arith``, ``final_answer``,
``boxed_format``, ``gsm8k_format`` and ``think_format``.
"""

from dagrl.rewards import arith, final_answer, formats, gsm8k, math_answer  # noqa: F401  (registers built-ins)
from dagrl.rewards.composer import RewardComposer, RewardTerm, mean_by_source
from dagrl.rewards.gsm8k import extract_gsm8k_answer
from dagrl.rewards.math_answer import last_boxed_content, math_answers_equal, normalize_math_answer
from dagrl.rewards.registry import (
    RewardFn,
    default_reward_name,
    get_reward,
    register_reward,
    registered_rewards,
)

__all__ = [
    "RewardComposer",
    "RewardFn",
    "RewardTerm",
    "default_reward_name",
    "extract_gsm8k_answer",
    "get_reward",
    "last_boxed_content",
    "math_answers_equal",
    "mean_by_source",
    "normalize_math_answer",
    "register_reward",
    "registered_rewards",
]
