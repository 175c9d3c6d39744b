"""Batch: DP split/concat, grouping, indexing, key checks, and the padding/position-id layout."""

from __future__ import annotations

import pytest
import torch

from dagrl.core.batch import Batch, Held, left_pad, sequence_inputs


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


def test_teacher_sequence_inputs_align_responses_after_prompts_of_other_lengths():
    """OPSD: teacher prompts of 2, 5 and 3 tokens (padded to 7 columns), student prompts of other
    lengths; the teacher reads the same response ids and its logits map back to the [B, R] grid."""
    import torch.nn.functional as F

    from dagrl.core.batch import teacher_sequence_inputs

    teacher_prompts, teacher_mask = left_pad([[11, 12], [21, 22, 23, 24, 25], [31, 32, 33]], pad_id=0)
    teacher_prompts = F.pad(teacher_prompts, (2, 0))  # collated wider than the longest prompt
    teacher_mask = F.pad(teacher_mask, (2, 0))
    responses = torch.tensor([[101, 102, 103, 0], [201, 0, 0, 0], [301, 302, 303, 304]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])

    t = teacher_sequence_inputs(teacher_prompts, teacher_mask, responses, response_mask)
    assert t.input_ids.shape == (3, 5 + 4), "the 2 all-padding columns are dropped"
    assert t.input_ids[0].tolist() == [0, 0, 0, 11, 12, 101, 102, 103, 0]
    assert t.input_ids[1].tolist() == [21, 22, 23, 24, 25, 201, 0, 0, 0]
    assert t.position_ids[0, 3:8].tolist() == [0, 1, 2, 3, 4]
    assert t.position_ids[2, 2:9].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert t.attention_mask[1].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0]
    # logits at response_index[b, r] predict response token r: the next input id is that token
    next_ids = t.input_ids.gather(1, t.response_index + 1)
    assert (next_ids[response_mask == 1] == responses[response_mask == 1]).all()
    rows, cols = t.token_coordinates(response_mask)
    assert rows.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert cols.tolist() == [4, 5, 6, 4, 4, 5, 6, 7]


def test_teacher_logits_on_the_response_grid_match_each_row_scored_alone():
    """A real model: batched teacher inputs + response_index give each row's unpadded log-probs."""
    from transformers import AutoModelForCausalLM

    from dagrl.core.batch import teacher_sequence_inputs
    from dagrl.data.builtin import tiny_model_path

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    prompts = [[5, 60, 61, 62], [5, 70, 71, 72, 73, 74, 75, 1, 3], [5, 80]]
    teacher_prompts, teacher_mask = left_pad(prompts, pad_id=0)
    responses = torch.tensor([[56, 57, 1], [58, 1, 0], [59, 60, 61]])
    response_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    t = teacher_sequence_inputs(teacher_prompts, teacher_mask, responses, response_mask)
    with torch.no_grad():
        logits = model(
            input_ids=t.input_ids, attention_mask=t.attention_mask, position_ids=t.position_ids
        ).logits
        grid = logits.gather(1, t.response_index[..., None].expand(-1, -1, logits.shape[-1]))
        for b, prompt in enumerate(prompts):
            n = int(response_mask[b].sum())
            alone = model(input_ids=torch.tensor([prompt + responses[b, :n].tolist()])).logits[0]
            expected = alone[len(prompt) - 1 : len(prompt) - 1 + n]
            torch.testing.assert_close(grid[b, :n], expected, rtol=0, atol=1e-4)


def test_held_columns_split_join_and_materialize():
    """A column kept on the workers: split over its DP size into the pieces each rank holds, joined
    back from them; any other cut reads its values (fetched, here already on the driver)."""
    value = torch.arange(12.0).reshape(6, 2)
    held = Held("1.1", "old_logprobs", rows=6, dp_size=3, nbytes=48, value=value)
    batch = Batch({"prompts": torch.zeros(6, 1)}, held={"old_logprobs": held})
    shards = batch.split(3)
    assert [s.held["old_logprobs"].part for s in shards] == [0, 1, 2]
    assert torch.equal(shards[1]["old_logprobs"], value[2:4])
    joined = Batch.concat(shards)
    assert joined.held["old_logprobs"].part is None and torch.equal(joined["old_logprobs"], value)
    assert torch.equal(batch.split(2)[1]["old_logprobs"], value[3:])  # another DP size: the values
    assert torch.equal(batch.index([5, 0])["old_logprobs"], value[[5, 0]])


def test_the_n_samples_of_a_prompt_travel_once_and_expand_to_the_drivers_rows():
    """A collated batch (rows repeated n times) goes to a worker as its distinct rows and is
    expanded there to exactly the shard the driver holds (values, dtype, shape, its own storage);
    the mark survives DP splits that keep the runs whole, and nothing else."""
    import pickle

    from dagrl.core.residency import tensor_bytes

    batch = make_batch(4).repeat_interleave(4)  # 16 rows: 4 prompts × 4 samples
    marks = {"prompts": 4, "scores": 4, "data_source": 4, "ground_truth": 4}
    assert batch.repeats == marks
    for shard in batch.split(2):  # 8 rows each: runs whole
        assert shard.repeats == marks
        wire = pickle.loads(pickle.dumps(shard.compacted()))  # what the worker receives
        assert tensor_bytes(wire) == tensor_bytes(shard) // 4
        # the meta lists (an environment's reset reads them) travel once per prompt too
        assert {k: len(v.rows) for k, v in wire.meta.items()} == {"data_source": 2, "ground_truth": 2}
        got = wire.expanded()
        assert_same(got, shard)
        for key, value in got.tensors.items():
            assert value.dtype == shard.tensors[key].dtype and value.is_contiguous()
    assert all(not s.repeats for s in batch.split(8))  # 2 rows: a run would be cut
    assert Batch.concat(batch.split(2)).repeats == batch.repeats
    assert not batch.index(list(range(16))).repeats and not batch.chunks(4)[0].repeats
    moved = {"prompts": batch.tensors["prompts"], "scores": batch.tensors["scores"] + 1}
    kept = {"prompts": 4, "data_source": 4, "ground_truth": 4}
    assert batch.repeats_of(moved) == kept  # a new tensor loses the mark
    assert batch.repeats_of(moved, {"ground_truth": list(batch.meta["ground_truth"])}) == {"prompts": 4}
