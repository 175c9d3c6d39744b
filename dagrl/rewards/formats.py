"""Format rewards: score whether a response has the expected shape, regardless of correctness.

Useful as small-weight shaping terms next to a correctness reward.
"""

from __future__ import annotations

import re

from dagrl.rewards.gsm8k import NUMBER_PATTERN
from dagrl.rewards.math_answer import find_closing_brace
from dagrl.rewards.registry import register_reward

_BOXED_OPEN = re.compile(r"\\boxed\s*\{")
_GSM8K_ANSWER_LINE = re.compile(r"####\s*" + NUMBER_PATTERN)
# Reasoning inside one <think> block, then a non-empty answer that opens no second block.
_THINK_THEN_ANSWER = re.compile(r"\s*<think>.*?</think>(?P<answer>.*)", re.DOTALL)


def has_balanced_boxed(text: str) -> bool:
    """True if some ``\\boxed{`` in ``text`` has a matching closing brace."""
    return any(find_closing_brace(text, match.end() - 1) is not None for match in _BOXED_OPEN.finditer(text))


@register_reward("boxed_format")
def boxed_format_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response contains a ``\\boxed{...}`` with balanced braces, else 0.0."""
    return 1.0 if has_balanced_boxed(solution_str) else 0.0


@register_reward("gsm8k_format")
def gsm8k_format_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response contains a GSM8K answer line ``#### <number>``, else 0.0."""
    return 1.0 if _GSM8K_ANSWER_LINE.search(solution_str) else 0.0


@register_reward("think_format")
def think_format_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response is ``<think>...</think>`` followed by non-empty answer text, else 0.0."""
    match = _THINK_THEN_ANSWER.fullmatch(solution_str)
    if match is None:
        return 0.0
    answer = match.group("answer")
    if "<think>" in answer or "</think>" in answer:
        return 0.0
    return 1.0 if answer.strip() else 0.0
