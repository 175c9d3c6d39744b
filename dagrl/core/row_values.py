"""Per-token columns that hold one value per row travel as that value: the driver sends [B]
instead of [B, R], and the workers expand it again before the update reads it.

GRPO's advantages (and RLOO's, Dr. GRPO's, GSPO's: any group-normalised score without KL in the
reward or per-turn credit) are the row's advantage on each of its policy tokens and 0 elsewhere,
`row_value[:, None] * response_mask`. The advantage node computes them on the driver, so they
would cross to the train workers as a [B, R] float tensor; sent as `row_advantages` [B] they cost
1/R of that, and the workers, which hold `response_mask` already, rebuild the same tensor bit for
bit. A column that is not exactly that (GAE's, REINFORCE++'s discounted returns, KL in the reward,
turn credit) is sent as it is.
"""

from __future__ import annotations

import torch

from dagrl.core.batch import Batch

ROW_KEYS = {"advantages": "row_advantages"}  # the token column and its per-row form (both in KEYS)


def _driver_mask(batch: Batch) -> torch.Tensor | None:
    """The response mask where the driver has it without fetching it from the workers."""
    if "response_mask" in batch.tensors:
        return batch.tensors["response_mask"]
    held = batch.held.get("response_mask")
    return held.value if held is not None else None


def per_row(batch: Batch) -> Batch:
    """`batch` with each token column of ROW_KEYS that is exactly one value per row on the mask
    replaced by its [B] form (what the driver sends the update)."""
    mask = _driver_mask(batch)
    if mask is None:
        return batch
    tensors = dict(batch.tensors)
    for key, row_key in ROW_KEYS.items():
        column = tensors.get(key)
        if column is None or column.dim() != 2 or column.shape != mask.shape:
            continue
        weights = mask.to(column.dtype)
        # the value on the row's first policy token (a row without one is all zeros: 0)
        first = torch.argmax((weights != 0).to(torch.int8), dim=1)
        values = column.gather(1, first[:, None]).squeeze(1)
        if torch.equal(values[:, None] * weights, column):
            del tensors[key]
            tensors[row_key] = values
    return Batch(tensors, dict(batch.meta), dict(batch.held), batch.repeats_of(tensors))


def per_token(batch: Batch) -> Batch:
    """The update's batch with each [B] row column expanded back to its token column [B, R]
    (`row_value[:, None] * response_mask`): what the objective reads."""
    rows = [k for k, row_key in ROW_KEYS.items() if row_key in batch]
    if not rows:
        return batch
    tensors = dict(batch.tensors)
    for key in rows:
        values = tensors.pop(ROW_KEYS[key])
        tensors[key] = values[:, None] * batch["response_mask"].to(values.dtype)
    return Batch(tensors, dict(batch.meta), dict(batch.held))
