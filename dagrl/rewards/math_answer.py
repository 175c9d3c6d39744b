"""MATH-style reward: compare the last ``\\boxed{...}`` answer with the reference after normalization.

Normalization removes LaTeX that changes how an answer looks but not what it says (spacing
commands, ``\\left``/``\\right``, ``\\text{}`` wrappers, degree marks, ``\\dfrac``), so that
``\\dfrac12`` and ``\\frac{1}{2}`` compare equal. It does not attempt symbolic equivalence.
"""

from __future__ import annotations

import math
import re

from dagrl.rewards.registry import register_reward

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_SPACING = re.compile(r"\\[!,;:]|\\ ")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°")
_ASSIGNMENT = re.compile(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?=(?P<value>[^=]+)$")
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_SIMPLE_FRACTION = re.compile(r"(?P<sign>-?)\\frac\{(?P<num>-?[\d.]+)\}\{(?P<den>-?[\d.]+)\}")


def find_closing_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` matching the ``{`` at ``open_index``, or None if braces never balance."""
    assert text[open_index] == "{", "open_index must point at '{'"
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def _box_argument(text: str, start: int) -> str | None:
    """Argument of a box command whose name ends just before ``start``."""
    index = start
    while index < len(text) and text[index] == " ":
        index += 1
    if index >= len(text):
        return None
    if text[index] == "{":
        close = find_closing_brace(text, index)
        return None if close is None else text[index + 1 : close]
    if index == start and text[index].isalpha():
        return None  # "\boxedx" is a different command, not "\boxed x"
    # "\boxed 5": the argument is the next token, up to whitespace or a closing math delimiter.
    token = re.match(r"[^\s$]+", text[index:])
    return token.group(0) if token else None


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (nested braces allowed) or ``\\boxed x``.

    Returns None when there is no box or the last box's braces never close.
    """
    starts = [(text.rfind(command), command) for command in _BOX_COMMANDS]
    position, command = max(starts)
    if position < 0:
        return None
    return _box_argument(text, position + len(command))


def _read_group(s: str, index: int) -> tuple[str, int] | None:
    """Read one LaTeX argument at ``index``: a ``{...}`` group or a single character."""
    if index >= len(s):
        return None
    if s[index] == "{":
        close = find_closing_brace(s, index)
        return None if close is None else (s[index + 1 : close], close + 1)
    if s[index] == "\\":
        return None  # a command as bare argument is rare; leave the text untouched
    return s[index], index + 1


def _expand_shorthand(s: str, command: str, arity: int) -> str:
    """Rewrite ``\\frac12`` as ``\\frac{1}{2}`` (and ``\\sqrt2`` as ``\\sqrt{2}``)."""
    out, index = [], 0
    while (found := s.find(command, index)) >= 0:
        out.append(s[index:found] + command)
        index = found + len(command)
        if index < len(s) and s[index].isalpha():
            continue  # longer command name, e.g. \fracx is not \frac
        args, cursor = [], index
        for _ in range(arity):
            group = _read_group(s, cursor)
            if group is None:
                break
            args.append(_expand_shorthand(group[0], command, arity))
            cursor = group[1]
        if len(args) == arity:
            out.append("".join("{" + arg + "}" for arg in args))
            index = cursor
    out.append(s[index:])
    return "".join(out)


def _unwrap_text(s: str) -> str:
    previous = None
    while previous != s:  # repeat so nested wrappers like \text{\textbf{A}} unwrap fully
        previous, s = s, _TEXT_WRAPPER.sub(r"\1", s)
    return s


def normalize_math_answer(s: str) -> str:
    """Canonical string form of a math answer for equality checks.

    Removes whitespace, ``$``, ``\\left``/``\\right``, LaTeX spacing (``\\!``, ``\\,``), degree
    marks and a trailing period; unwraps ``\\text{...}``; maps ``\\dfrac``/``\\tfrac`` to
    ``\\frac`` and ``\\frac12`` to ``\\frac{1}{2}``; reduces a single assignment ``x = 5`` to ``5``.
    """
    s = _LEFT_RIGHT.sub("", s.strip())
    s = _SPACING.sub("", s)
    s = _unwrap_text(s)
    s = _DEGREES.sub("", s)
    s = s.replace("$", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    assignment = _ASSIGNMENT.match(s)
    if assignment:
        s = assignment.group("value")
    s = _expand_shorthand(s, "\\frac", arity=2)
    s = _expand_shorthand(s, "\\sqrt", arity=1)
    return s.rstrip(".")


def _as_number(s: str) -> float | None:
    """Value of a normalized answer that is a plain number, thousands-comma number or ``\\frac{a}{b}``."""
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if _NUMBER.fullmatch(s):
        return float(s)
    fraction = _SIMPLE_FRACTION.fullmatch(s)
    if fraction and _NUMBER.fullmatch(fraction["num"]) and _NUMBER.fullmatch(fraction["den"]):
        denominator = float(fraction["den"])
        if denominator == 0:
            return None
        value = float(fraction["num"]) / denominator
        return -value if fraction["sign"] else value
    return None


def math_answers_equal(a: str, b: str) -> bool:
    """True if ``a`` and ``b`` normalize to the same string or are numbers within 1e-6."""
    norm_a, norm_b = normalize_math_answer(a), normalize_math_answer(b)
    if norm_a == norm_b:
        return True
    value_a, value_b = _as_number(norm_a), _as_number(norm_b)
    if value_a is None or value_b is None:
        return False
    return math.isclose(value_a, value_b, rel_tol=0.0, abs_tol=1e-6)


@register_reward("math")
def math_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the last boxed answer equals ``ground_truth`` (plain or itself boxed), else 0.0."""
    answer = last_boxed_content(solution_str)
    if answer is None:
        return 0.0
    reference = last_boxed_content(ground_truth)
    if reference is None:
        reference = ground_truth
    return 1.0 if math_answers_equal(answer, reference) else 0.0
