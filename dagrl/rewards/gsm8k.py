"""GSM8K reward: compare the response's final number with the reference answer.

The answer is read strictly after the last ``####`` when the response has one (the format the
GSM8K references use); otherwise flexibly as the last number near the end of the response.
"""

from __future__ import annotations

import math
import re

from dagrl.rewards.registry import register_reward

# A number as models write it: optional sign and dollar sign, digits with optional thousands
# commas, optional decimals. Thousands groups are explicit so "3, 4, 5" is three numbers, not one.
NUMBER_PATTERN = r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER = re.compile(NUMBER_PATTERN)
_STRICT_MARKER = "####"
# Long chains of thought mention many intermediate numbers; the answer sits near the end.
_FLEXIBLE_TAIL_CHARS = 300


def clean_number(token: str) -> str:
    """Strip commas, dollar signs, whitespace and a trailing period from a number token."""
    return token.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_gsm8k_answer(text: str) -> str | None:
    """Final answer of a GSM8K-style response as a clean number string, or None if there is none.

    Strict: the first number after the last ``####``. Flexible (no ``####``): the last number in
    the final 300 characters.
    """
    marker = text.rfind(_STRICT_MARKER)
    if marker >= 0:
        match = _NUMBER.search(text, marker + len(_STRICT_MARKER))
        return clean_number(match.group(0)) if match else None
    numbers = _NUMBER.findall(text[-_FLEXIBLE_TAIL_CHARS:])
    return clean_number(numbers[-1]) if numbers else None


def numbers_equal(a: str, b: str) -> bool:
    """True when two clean number strings denote the same value ("72.00" == "72")."""
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    except ValueError:
        return a == b


def _reference_answer(ground_truth: str) -> str:
    # Accept both the bare answer ("1,000") and a full GSM8K solution ending in "#### 1,000".
    if _STRICT_MARKER in ground_truth:
        extracted = extract_gsm8k_answer(ground_truth)
        if extracted is not None:
            return extracted
    return clean_number(ground_truth)


@register_reward("gsm8k")
def gsm8k_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response's final number equals ``ground_truth`` numerically, else 0.0."""
    answer = extract_gsm8k_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if numbers_equal(answer, _reference_answer(ground_truth)) else 0.0
