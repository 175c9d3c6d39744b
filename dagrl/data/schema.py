"""The row layout of dagrl's parquet prompt files, and its checks.

One row is one prompt (the verl/siiRL layout, so their files load unchanged)::

    data_source   str                      which dataset the row came from; picks the reward function
    prompt        list[{role, content}]    chat messages given to the policy
    ability       str                      a free-form tag ("math")
    reward_model  {style, ground_truth}    ground_truth: the reference answer the reward checks against
    extra_info    {split, index, ...}      anything else; carried through to the reward function
    teacher_prompt list[{role, content}]   optional: what an OPSD teacher sees (problem + reference solution)
    response      str                      optional: a reference response (distillation's off-policy
                                           steps and SFT term; data.response_key names another column)

Every check raises `DataError` naming the file (or source) and row, what is wrong and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dagrl.errors import ConfigError, DataError

REQUIRED_COLUMNS: tuple[str, ...] = ("data_source", "prompt", "ability", "reward_model", "extra_info")
OPTIONAL_COLUMNS: tuple[str, ...] = ("teacher_prompt", "response")
ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})

_LAYOUT_HINT = "see docs/data.md for the row layout, or regenerate the file with examples/data_preprocess"


def required_columns(prompt_key: str = "prompt") -> tuple[str, ...]:
    """REQUIRED_COLUMNS with the prompt column renamed to `prompt_key` (data.prompt_key)."""
    return tuple(prompt_key if col == "prompt" else col for col in REQUIRED_COLUMNS)


def validate_columns(column_names: Iterable[str], source: str, *, prompt_key: str = "prompt") -> None:
    """Check a whole file's columns at once, naming every missing one and listing those present."""
    present = list(column_names)
    missing = [col for col in required_columns(prompt_key) if col not in present]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; the file has {present} — {_LAYOUT_HINT}")


def check_prompt_column(column_names: Iterable[str], path: str, files_key: str, prompt_key: str) -> None:
    """The column data.prompt_key names is in a file of the layout (a `messages` file fills its
    prompt from the conversation); else one ConfigError naming the key, its value, the file, its
    columns and the fix. A file missing more of the layout is left to validate_columns."""
    from difflib import get_close_matches

    present = list(column_names)
    if prompt_key in present or "messages" in present:
        return
    if any(col not in present for col in required_columns(prompt_key) if col != prompt_key):
        return
    if "prompt" in present:
        fix = "set data.prompt_key=prompt (the layout's name; it is the default)"
    else:
        near = get_close_matches(prompt_key, present, n=1)
        fix = f"did you mean data.prompt_key={near[0]}? " if near else ""
        fix += "set data.prompt_key to the column holding the chat messages (docs/data.md)"
    raise ConfigError(
        "data.prompt_key", prompt_key, f"{files_key} file {path} has no such column (it has {present}); {fix}"
    )


def validate_messages(messages: Any, what: str) -> str | None:
    """Return what is wrong with a chat message list (None when it is fine).

    `what` names the field in the message ("prompt", "teacher_prompt").
    """
    if not isinstance(messages, (list, tuple)) or len(messages) == 0:
        return f"'{what}' must be a non-empty list of chat messages, got {_describe(messages)}"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"'{what}'[{i}] must be a dict with 'role' and 'content', got {_describe(message)}"
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str):
            return f"'{what}'[{i}] has no string 'role' (got {_describe(role)})"
        if role not in ROLES:
            return f"'{what}'[{i}] has role {role!r}; roles must be one of {sorted(ROLES)}"
        if not isinstance(content, str):
            return f"'{what}'[{i}] has no string 'content' (got {_describe(content)})"
    return None


def validate_row(row: dict, *, source: str, index: int, prompt_key: str = "prompt") -> None:
    """Check one row against the layout above; raise DataError naming `source` row `index`."""
    problem = _find_problem(row, prompt_key)
    if problem is not None:
        raise DataError(f"{source} row {index}: {problem}")


def _find_problem(row: Any, prompt_key: str) -> str | None:
    """What is wrong with a row and how to fix it, or None."""
    if not isinstance(row, dict):
        return f"a row must be a dict of columns, got {_describe(row)} — {_LAYOUT_HINT}"
    missing = [col for col in required_columns(prompt_key) if col not in row]
    if missing:
        return f"missing column(s) {missing}; the row has {sorted(row)} — {_LAYOUT_HINT}"
    for col in ("data_source", "ability"):
        if not isinstance(row[col], str):
            return f"'{col}' must be a string, got {_describe(row[col])} — {_LAYOUT_HINT}"
    bad_prompt = validate_messages(row[prompt_key], prompt_key)
    if bad_prompt:
        return f"{bad_prompt} — write it as [{{'role': 'user', 'content': '...'}}]"
    bad_reward = _check_reward_model(row["reward_model"])
    if bad_reward:
        return bad_reward
    if not isinstance(row["extra_info"], dict) and row["extra_info"] is not None:
        return f"'extra_info' must be a dict (or null), got {_describe(row['extra_info'])} — {_LAYOUT_HINT}"
    teacher = teacher_messages(row.get("teacher_prompt"))
    if teacher is not None:
        bad_teacher = validate_messages(teacher, "teacher_prompt")
        if bad_teacher:
            return f"{bad_teacher} — leave teacher_prompt null for rows without a reference solution"
    return None


def teacher_messages(value: Any) -> Any:
    """A row's privileged teacher prompt as chat messages, or None when it has none.

    As in ms-swift, an empty one (None, "", []) means "none": the row is distilled as plain GKD;
    a string is one user turn (ms-swift's preprocessors write it so)."""
    if value is None or (isinstance(value, (str, list, tuple)) and len(value) == 0):
        return None
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return value


def _check_reward_model(reward_model: Any) -> str | None:
    if not isinstance(reward_model, dict):
        return (
            f"'reward_model' must be a dict like {{'style': 'rule', 'ground_truth': '72'}}, "
            f"got {_describe(reward_model)}"
        )
    truth = reward_model.get("ground_truth")
    if truth is None:
        return "'reward_model' has no 'ground_truth' — add the reference answer as reward_model.ground_truth"
    if not isinstance(truth, str) or not truth.strip():
        return (
            f"'reward_model.ground_truth' must be a non-empty string, got {_describe(truth)} — "
            "store the reference answer as text, or drop the row"
        )
    return None


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def response_text(row: dict, response_key: str) -> str | None:
    """The reference response of a row under data.response_key (``column`` or ``column.key``, the
    latter verl's response_key + response_dict_keys); None when the row has none."""
    column, _, key = response_key.partition(".")
    value = row.get(column)
    if key and isinstance(value, dict):
        value = value.get(key)
    elif key:
        value = None
    if value is not None and not isinstance(value, str):
        raise DataError(f"data.response_key={response_key!r}: expected text, got {type(value).__name__}")
    return value or None
