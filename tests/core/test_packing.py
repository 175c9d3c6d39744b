"""core/packing.py: the packed layout of a hand-made micro-batch, checked cell by cell."""

from __future__ import annotations

import torch

from dagrl.core.batch import left_pad
from dagrl.core.packing import PaddingStats, first_fit_decreasing, pack_sequences


def test_first_fit_decreasing_places_longest_first():
    # 7 opens bin 0, 5 bin 1, 3 fits bin 0 (7+3=10), 2 fits bin 1 (5+2), 2 fits bin 1 (9)
    assert first_fit_decreasing([2, 7, 3, 5, 2], capacity=10) == [[1, 2], [3, 0, 4]]
    assert first_fit_decreasing([4, 4, 4], capacity=4) == [[0], [1], [2]]


def hand_batch():
    """Sequence lengths 3+3=6, 1+1=2, 2+0=2, 2+2=4 (prompt+response)."""
    prompts, prompt_mask = left_pad([[11, 12, 13], [21], [31, 32], [41, 42]], pad_id=0)
    responses = torch.tensor([[14, 15, 16], [22, 0, 0], [0, 0, 0], [43, 44, 0]])
    response_mask = (responses > 0).long()
    return prompts, prompt_mask, responses, response_mask


def test_pack_sequences_layout():
    packed = pack_sequences(*hand_batch())
    # capacity 6: [seq0] (6), [seq3 (4) + seq1 (2)], [seq2 (2) + tail 4]
    assert packed.input_ids.tolist() == [
        [11, 12, 13, 14, 15, 16],
        [41, 42, 43, 44, 21, 22],
        [31, 32, 0, 0, 0, 0],
    ]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1], [0, 1, 0, 1, 2, 3]]
    assert packed.segment_ids.tolist() == [[0] * 6, [0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1]]
    # response tokens in [B, R] row-major order, each predicted one column before it
    assert packed.token_targets.tolist() == [14, 15, 16, 22, 43, 44]
    assert packed.token_rows.tolist() == [0, 0, 0, 1, 1, 1]
    assert packed.token_columns.tolist() == [2, 3, 4, 4, 1, 2]
    assert packed.token_index.tolist() == [0, 1, 2, 3, 9, 10]
    assert (packed.real_tokens, packed.padded_tokens, packed.packed_tokens) == (14, 24, 18)
    # the targets sit right after their predicting columns
    after = packed.input_ids[packed.token_rows, packed.token_columns + 1]
    assert after.tolist() == packed.token_targets.tolist()


def test_attention_mask_is_block_diagonal_causal():
    packed = pack_sequences(*hand_batch())
    allowed = ~packed.attention_mask()[1, 0]  # row 1: sequences of 4 and 2 tokens
    want = torch.zeros(6, 6, dtype=torch.bool)
    want[:4, :4] = torch.ones(4, 4).tril().bool()
    want[4:, 4:] = torch.ones(2, 2).tril().bool()
    assert torch.equal(allowed, want)
    assert (~packed.attention_mask()).diagonal(dim1=2, dim2=3).all()  # every query sees itself


def test_to_grid_puts_tokens_back_with_zero_padding():
    packed = pack_sequences(*hand_batch())
    grid = packed.to_grid(packed.token_targets.float())
    assert grid.tolist() == [[14, 15, 16], [22, 0, 0], [0, 0, 0], [43, 44, 0]]


def test_row_length_rounds_up_to_a_multiple():
    packed = pack_sequences(*hand_batch(), multiple=4)
    assert packed.input_ids.shape[1] == 8


def test_padding_stats():
    stats = PaddingStats()
    stats.add(real=14, padded=24, packed=18)
    stats.add(real=6, padded=16, packed=8)
    assert stats.metrics() == {"perf/pad_fraction": 0.5, "perf/packed_pad_fraction": 1 - 20 / 26}
    assert PaddingStats().metrics() == {}
