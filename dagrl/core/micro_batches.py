"""Micro-batches of a batch: a fixed number of rows, or as many rows as a token budget holds.

The token budget is verl's dynamic batch size (`use_dynamic_bsz` with `ppo_max_token_len_per_gpu`,
`log_prob_use_dynamic_bsz` with `log_prob_max_token_len_per_gpu`): each micro-batch takes the next
rows, in order, while their real tokens (prompt + response, padding not counted) fit the budget;
a row longer than the budget on its own forms a micro-batch of one. Rows keep their order, so
outputs concatenated over the micro-batches line up with the batch. The losses stay exact because
the objective weighs each micro-batch by its share of the mini-batch's tokens or rows
(`Objective.micro_batch_weights`), whatever the sizes.
"""

from __future__ import annotations

from dagrl.core.batch import Batch, response_attention


def token_budget_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive row indices grouped so that each group's lengths sum to at most `budget`
    (a single longer row forms its own group)."""
    assert budget >= 1, budget
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if current and used + n > budget:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        groups.append(current)
    return groups


def row_tokens(batch: Batch) -> list[int]:
    """Real tokens (prompt + response) of each row: what its forward pass runs over, so a
    multi-turn row's observations count (response_attention_mask), not only the policy's tokens."""
    return (batch["prompt_mask"].sum(dim=1) + response_attention(batch).sum(dim=1)).tolist()


def micro_batches(batch: Batch, rows: int, token_budget: int | None = None) -> list[Batch]:
    """`rows` rows each, or (token_budget set) rows up to `token_budget` real tokens each."""
    if token_budget is None:
        return batch.chunks(rows)
    return [batch.index(group) for group in token_budget_groups(row_tokens(batch), token_budget)]
