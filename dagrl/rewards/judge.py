"""A generative judge's prompt and the score read from its answer (pure functions, no model).

An LLM judge (reward.model.type=generative, ms-swift's `reward_model_plugin=genrm`, verl's
generative reward model) reads a prompt made from a template and answers in text; the first match
of a regular expression in that text is its score, mapped from [low, high] onto [0, 1]. An answer
without a score, a score outside the range or a prompt the judge cannot read is a failure: it gets
the neutral score and is counted (reward/judge_failures), never raised, so one bad judgment does
not stop a run. Gu et al. 2024 ("A Survey on LLM-as-a-Judge") for the scheme.
"""

from __future__ import annotations

import math
import re

import torch

TEMPLATE_FIELDS = ("prompt", "response", "ground_truth")


def render_judge_prompt(template: str, prompt: str, response: str, ground_truth: str) -> str:
    """The judge's user turn: `template` with {prompt}, {response} and {ground_truth} filled in.

    >>> render_judge_prompt("Q: {prompt} A: {response} Ref: {ground_truth}", "1+1=", "2", "2")
    'Q: 1+1= A: 2 Ref: 2'
    """
    return template.format(prompt=prompt, response=response, ground_truth=ground_truth)


def parse_judge_score(text: str, pattern: str, low: float, high: float) -> float | None:
    """The judge's score in [0, 1]: the first match of `pattern` (its first group, or the whole
    match) as a number, mapped from [low, high]; None when there is no number or it is outside.

    >>> parse_judge_score("Score: 8/10", r"Score:\\s*(-?\\d+(?:\\.\\d+)?)", 0, 10)
    0.8
    >>> parse_judge_score("no idea", r"(\\d+)", 0, 10) is None
    True
    """
    match = re.search(pattern, text)
    if match is None:
        return None
    try:
        value = float(match.group(1) if match.groups() else match.group(0))
    except ValueError:
        return None
    if not math.isfinite(value) or not low <= value <= high:
        return None
    return (value - low) / (high - low)


def judge_scores(
    outputs: list[str | None], pattern: str, low: float, high: float, neutral: float
) -> tuple[torch.Tensor, int]:
    """[B] scores of the judge's answers (None = the judge could not read the prompt) and the
    number of failures, each of which scores `neutral`."""
    parsed = [None if text is None else parse_judge_score(text, pattern, low, high) for text in outputs]
    failures = sum(p is None for p in parsed)
    return torch.tensor([neutral if p is None else p for p in parsed], dtype=torch.float32), failures
