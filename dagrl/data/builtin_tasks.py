"""The built-in tasks by name (`data.builtin_task`): each one's row builder, with one signature.

Every builder is ``generate_rows(split, num_rows, seed, teacher_prompts) -> list[dict]``: the
caller (training, the sampling pipeline, preprocessing) says whether rows carry OPSD's privileged
``teacher_prompt`` and never needs to know which task it reads.
"""

from __future__ import annotations

from typing import Protocol

from dagrl.data import builtin, builtin_calculator


class RowBuilder(Protocol):
    def __call__(self, split: str, num_rows: int, seed: int, teacher_prompts: bool = True) -> list[dict]: ...


# by data.builtin_task's value (data sits below config: the enum is not imported here)
BUILDERS: dict[str, RowBuilder] = {
    "arith": builtin.generate_rows,
    "calculator": builtin_calculator.generate_rows,
}


def builtin_rows(task: str, split: str, num_rows: int, seed: int, teacher_prompts: bool) -> list[dict]:
    """``num_rows`` rows of built-in task ``task``'s ``split``; ``teacher_prompts=False`` leaves
    out the privileged prompt (under ``algorithm=gkd`` a row with one would be distilled OPSD-style)."""
    return BUILDERS[getattr(task, "value", task)](split, num_rows, seed, teacher_prompts)
