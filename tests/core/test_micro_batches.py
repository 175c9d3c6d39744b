"""Token-budget micro-batches (verl's use_dynamic_bsz): consecutive rows while their real tokens fit."""

from __future__ import annotations

import torch

from dagrl.core.batch import Batch
from dagrl.core.micro_batches import micro_batches, token_budget_groups


def test_groups_by_hand():
    # 3 | 4+2 = 6 | 9 alone (longer than the budget) | 1+1
    assert token_budget_groups([3, 4, 2, 9, 1, 1], 6) == [[0], [1, 2], [3], [4, 5]]
    assert token_budget_groups([2, 2, 2], 100) == [[0, 1, 2]]
    assert token_budget_groups([5, 5], 1) == [[0], [1]]


def test_budget_is_never_exceeded_except_by_one_long_row():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (200,), generator=g).tolist()
    for budget in (1, 7, 30, 64, 500):
        groups = token_budget_groups(lengths, budget)
        assert [i for group in groups for i in group] == list(range(len(lengths)))  # order kept
        for group in groups:
            assert sum(lengths[i] for i in group) <= budget or len(group) == 1


def test_micro_batches_count_real_tokens_of_prompt_and_response():
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]])
    response_mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    batch = Batch({"prompt_mask": prompt_mask, "response_mask": response_mask, "group_ids": torch.arange(4)})
    # real tokens per row: 4, 4, 3, 5 -> budget 7: [0], [1, 2], [3]
    assert [mb["group_ids"].tolist() for mb in micro_batches(batch, rows=99, token_budget=7)] == [
        [0],
        [1, 2],
        [3],
    ]
    assert [len(mb) for mb in micro_batches(batch, rows=3)] == [3, 1]


def test_multi_turn_rows_count_their_observations_against_the_budget():
    """A multi-turn row's forward runs over its observations too: 2 prompt + 6 response tokens,
    of which only 3 are the policy's, is 8 tokens; two such rows do not fit a budget of 12."""
    row = {
        "prompts": torch.tensor([[5, 6]]),
        "prompt_mask": torch.ones(1, 2, dtype=torch.long),
        "responses": torch.tensor([[7, 8, 9, 10, 11, 12]]),
        "response_mask": torch.tensor([[1, 0, 0, 0, 1, 1]]),
        "response_attention_mask": torch.ones(1, 6, dtype=torch.long),
    }
    batch = Batch({k: v.repeat(2, 1) for k, v in row.items()})
    assert [len(mb) for mb in micro_batches(batch, rows=2, token_budget=12)] == [1, 1]
