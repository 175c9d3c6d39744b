"""OPSD follows the rows under algorithm=gkd, as in ms-swift: a row with a non-empty teacher_prompt is
scored by the teacher after it, a row with none (null, "", []) after its own prompt (plain GKD), in
one batch; the teacher node counts both kinds for the step line."""

from __future__ import annotations

from dagrl.core.batch import Batch
from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled
from dagrl.data import PromptDataset
from dagrl.data.builtin import generate_rows
from dagrl.nodes.teacher import prompt_kinds, with_teacher_prompts
from dagrl.trainer.logger import format_line
from dagrl.trainer.loop import collate
from tests.conftest import compose_config
from tests.data.test_parquet import char_tokenizer, make_row


def test_a_mixed_batch_under_gkd_is_distilled_row_by_row_and_counted():
    cfg = compose_config("algorithm=gkd")
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout", "teacher"})
    assert {"teacher_prompts", "teacher_prompt_mask"} <= set(dag.node("teacher_hidden").inputs)
    tok = char_tokenizer()
    rows = [
        make_row(1, "1+0=", teacher=True),
        dict(make_row(2, "1+1="), teacher_prompt=""),
        dict(make_row(3, "2+1="), teacher_prompt=[]),
        dict(make_row(4, "2+2="), teacher_prompt="2+2? ref: 4"),  # ms-swift writes a string
        make_row(5, "3+2="),
    ]
    data = PromptDataset.from_rows(rows, tok, 64, source="rows")
    batch = collate([data[i] for i in range(5)], tok.pad_token_id, 2, 0, source, response_width=2)
    sampled = {"responses": batch["dataset_responses"], "response_mask": batch["dataset_response_mask"]}
    batch = batch.union(Batch(sampled))
    view = with_teacher_prompts(batch)
    for row, example in enumerate(data[i] for i in range(5)):
        got = view["prompts"][2 * row][view["prompt_mask"][2 * row].bool()].tolist()
        assert got == (example.teacher_prompt_ids or example.prompt_ids), row
    kinds = prompt_kinds(batch)
    assert kinds == {"distill/opsd_rows": 4.0, "distill/gkd_rows": 6.0}  # rows × rollout.n
    assert "opsd_rows 4 gkd_rows 6" in format_line(1, kinds)


def test_the_builtin_task_keeps_its_privileged_prompt_for_algorithm_opsd_only():
    assert "teacher_prompt" in generate_rows("train", 1, seed=0)[0]
    assert "teacher_prompt" not in generate_rows("train", 1, seed=0, teacher_prompts=False)[0]
