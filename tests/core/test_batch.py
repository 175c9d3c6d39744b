"""Batch: DP split/concat, grouping, indexing, key checks, and the padding/position-id layout."""

from __future__ import annotations

import pytest
import torch

from dagrl.core.batch import Batch, left_pad, sequence_inputs


def make_batch(rows: int = 6) -> Batch:
    return Batch(
        tensors={
            "prompts": torch.arange(rows * 3).reshape(rows, 3),
            "scores": torch.arange(rows, dtype=torch.float32) / 10,
        },
        meta={"data_source": [f"src{i}" for i in range(rows)], "ground_truth": list(range(rows))},
    )


def assert_same(a: Batch, b: Batch) -> None:
    assert a.keys() == b.keys()
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k
    assert a.meta == b.meta


def test_split_concat_round_trip():
    batch = make_batch(6)
    shards = batch.split(3)
    assert [len(s) for s in shards] == [2, 2, 2]
    # contiguous shards: shard 1 holds rows 2 and 3
    assert shards[1]["ground_truth"] == [2, 3]
    assert torch.equal(shards[1]["prompts"], torch.tensor([[6, 7, 8], [9, 10, 11]]))
    assert_same(Batch.concat(shards), batch)


def test_split_uneven_asserts():
    with pytest.raises(AssertionError, match="cannot split into 4"):
        make_batch(6).split(4)


def test_chunks_cover_rows_in_order():
    chunks = make_batch(5).chunks(2)
    assert [len(c) for c in chunks] == [2, 2, 1]
    assert_same(Batch.concat(chunks), make_batch(5))


def test_repeat_interleave_groups_rows():
    batch = make_batch(3).repeat_interleave(2)
    assert len(batch) == 6
    assert batch["ground_truth"] == [0, 0, 1, 1, 2, 2]
    assert torch.equal(batch["scores"], torch.tensor([0.0, 0.0, 0.1, 0.1, 0.2, 0.2]))
    assert torch.equal(batch["prompts"][2], batch["prompts"][3])
    assert torch.equal(batch["prompts"][2], torch.tensor([3, 4, 5]))


def test_index_reorders_tensors_and_meta_together():
    batch = make_batch(4)
    for idx in ([3, 0], torch.tensor([3, 0])):
        picked = batch.index(idx)
        assert picked["data_source"] == ["src3", "src0"]
        assert torch.equal(picked["prompts"], torch.tensor([[9, 10, 11], [0, 1, 2]]))


def test_select_and_union():
    batch = make_batch(2)
    left = batch.select(["prompts", "data_source"])
    right = batch.select(["scores", "ground_truth"])
    assert left.keys() == {"prompts", "data_source"}
    assert_same(left.union(right), batch)


def test_union_clash_asserts():
    batch = make_batch(2)
    with pytest.raises(AssertionError, match="keys produced twice: \\['scores'\\]"):
        batch.union(batch.select(["scores"]))


def test_undeclared_key_asserts():
    with pytest.raises(AssertionError, match="undeclared batch key 'prompt_ids'"):
        Batch({"prompt_ids": torch.zeros(2, 3)})
    with pytest.raises(AssertionError, match="undeclared batch key 'answer'"):
        Batch(meta={"answer": ["1", "2"]})


def test_row_count_mismatch_asserts():
    with pytest.raises(AssertionError, match="row count"):
        Batch({"prompts": torch.zeros(2, 3)}, {"data_source": ["a", "b", "c"]})


def test_left_pad():
    ids, mask = left_pad([[1, 2], [3], []], pad_id=9)
    assert torch.equal(ids, torch.tensor([[1, 2], [9, 3], [9, 9]]))
    assert torch.equal(mask, torch.tensor([[1, 1], [0, 1], [0, 0]]))


def test_sequence_inputs_position_ids():
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    responses = torch.tensor([[1, 2], [3, 0]])
    response_mask = torch.tensor([[1, 1], [1, 0]])
    input_ids, attention_mask, position_ids = sequence_inputs(prompts, prompt_mask, responses, response_mask)
    assert torch.equal(input_ids, torch.tensor([[0, 5, 6, 1, 2], [7, 8, 9, 3, 0]]))
    assert torch.equal(attention_mask, torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]))
    # the first real token is position 0 whatever the left padding; right padding repeats the last position
    assert torch.equal(position_ids, torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 3, 3]]))
