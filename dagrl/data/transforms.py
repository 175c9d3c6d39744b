"""Row transforms: plugins reshape dataset rows before they are validated and tokenized.

A module named in `external_plugins` registers a function `row -> row`; every training and
validation row (parquet files and the built-in task alike) passes through the registered
functions in registration order, and the result is validated like any row (docs/data.md). E.g.
an OPSD plugin adds a `teacher_prompt` built from the row's reference solution
(dagrl/plugins/opsd_reference_prompt.py):

    from dagrl.data.transforms import register_row_transform

    @register_row_transform
    def add_teacher_prompt(row: dict) -> dict:
        return {**row, "teacher_prompt": [...]}
"""

from __future__ import annotations

from collections.abc import Callable

RowTransform = Callable[[dict], dict]
_TRANSFORMS: list[RowTransform] = []


def register_row_transform(fn: RowTransform) -> RowTransform:
    """Apply `fn` to every dataset row from now on (registering the same function twice is a no-op)."""
    if fn not in _TRANSFORMS:
        _TRANSFORMS.append(fn)
    return fn


def apply_row_transforms(rows: list[dict]) -> list[dict]:
    """The rows after every registered transform."""
    for fn in _TRANSFORMS:
        rows = [fn(row) for row in rows]
    return rows
