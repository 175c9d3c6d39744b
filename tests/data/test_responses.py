"""Reference responses (data.response_key) and privileged teacher prompts, from the row to the
collated batch: what distillation's off-policy steps, SFT term and OPSD teacher read."""

from __future__ import annotations

import pytest
import torch

from dagrl.data import PromptDataset
from dagrl.data.builtin import generate_rows
from dagrl.data.schema import response_text
from dagrl.errors import DataError
from dagrl.trainer.loop import collate
from tests.data.test_parquet import char_tokenizer, make_row, write_rows


def test_response_text_reads_a_column_or_a_key_of_a_dict_column():
    row = {"response": "12", "extra_info": {"answer": "#### 12"}}
    assert response_text(row, "response") == "12"
    assert response_text(row, "extra_info.answer") == "#### 12"
    assert response_text(row, "extra_info.missing") is None
    assert response_text({"response": None}, "response") is None
    with pytest.raises(DataError, match="expected text"):
        response_text({"response": [1, 2]}, "response")


def test_dataset_tokenizes_responses_with_eos(tmp_path):
    tok = char_tokenizer()
    rows = [dict(make_row(1, "1+0="), response="1"), make_row(2, "1+1=", teacher=True)]
    data = PromptDataset(write_rows(tmp_path, "t.parquet", rows), tok, max_prompt_length=64)
    assert data[0].response_ids == tok.encode("1", add_special_tokens=False) + [tok.eos_token_id]
    assert data[1].response_ids is None and not data.has_responses
    by_key = PromptDataset(
        write_rows(tmp_path, "k.parquet", [make_row(3, "2+1=")]), tok, 64, response_key="extra_info.question"
    )
    assert by_key[0].response_ids[:-1] == tok.encode("2+1=", add_special_tokens=False)


def test_builtin_rows_carry_the_answer_as_response():
    row = generate_rows("train", 1, seed=0)[0]
    assert row["response"] == row["reward_model"]["ground_truth"]
    assert row["response"] in row["teacher_prompt"][0]["content"]


def test_collate_falls_back_to_the_students_prompt_and_pads_responses(tmp_path):
    tok = char_tokenizer()
    rows = [
        dict(make_row(1, "1+0=", teacher=True), response="1"),
        dict(make_row(22, "11+11="), response="22"),
    ]
    data = PromptDataset(write_rows(tmp_path, "t.parquet", rows), tok, max_prompt_length=64)
    source = (
        "prompts",
        "prompt_mask",
        "teacher_prompts",
        "teacher_prompt_mask",
        "dataset_responses",
        "dataset_response_mask",
    )
    batch = collate([data[0], data[1]], tok.pad_token_id, 2, 0, source, response_width=2)
    assert len(batch) == 4  # each row twice (rollout.n)
    teacher, tmask = batch["teacher_prompts"], batch["teacher_prompt_mask"]
    assert teacher[0][tmask[0].bool()].tolist() == data[0].teacher_prompt_ids
    # row 2 has no teacher_prompt: its teacher reads its own prompt (plain GKD)
    assert teacher[2][tmask[2].bool()].tolist() == data[1].prompt_ids
    # "1"+eos fits in 2; "22"+eos is cut to 2 tokens
    assert batch["dataset_response_mask"].tolist() == [[1, 1], [1, 1], [1, 1], [1, 1]]
    assert batch["dataset_responses"][0].tolist() == data[0].response_ids
    assert batch["dataset_responses"][2].tolist() == data[1].response_ids[:2]
    empty = collate([data[0]], tok.pad_token_id, 1, 0, source, response_width=4)
    assert empty["dataset_response_mask"].tolist() == [[1, 1, 0, 0]]
    assert torch.equal(empty["dataset_responses"][0, 2:], torch.full((2,), tok.pad_token_id))
