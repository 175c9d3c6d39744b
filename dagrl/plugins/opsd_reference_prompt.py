"""OPSD plugin: every row gets a privileged `teacher_prompt` built from its reference solution.

On-policy self-distillation (OPSD): the student answers the plain prompt; the teacher (often the
same model) reads the problem *with* a reference solution and scores the student's response token
by token, so the student learns what an informed version of itself would have said. Datasets made
without `--teacher_prompt_template` (examples/data_preprocess) have no teacher prompt; this plugin
adds one to every row that carries `extra_info.answer` (gsm8k, MATH, DeepScaleR rows do): the
row's own messages, with the reference appended to the last user message. Rows without a
reference keep their teacher prompt (the built-in task ships one) or get none.

    python -m dagrl.main experiment=gkd/opsd_plugin_teacher_standalone ...

(the preset names this module: `external_plugins=[dagrl.plugins.opsd_reference_prompt]`).
"""

from __future__ import annotations

from dagrl.data.transforms import register_row_transform

REFERENCE = "\n\nA reference solution:\n{answer}\n\nWith the reference in mind, solve the problem yourself."


@register_row_transform
def add_teacher_prompt(row: dict) -> dict:
    answer = (row.get("extra_info") or {}).get("answer")
    if not answer:
        return row
    messages = [dict(m) for m in row["prompt"]]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last_user]["content"] += REFERENCE.format(answer=str(answer).strip())
    return {**row, "teacher_prompt": messages}
