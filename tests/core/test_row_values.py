"""Advantages that are one value per row cross to the update as that value and are rebuilt there
bit for bit (core/row_values.py); any other column travels as it is."""

from __future__ import annotations

import torch

from dagrl.core.batch import Batch, Held
from dagrl.core.row_values import per_row, per_token

MASK = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]])  # a multi-turn gap; an empty row


def test_row_constant_advantages_travel_per_row_and_come_back_exactly():
    values = torch.tensor([0.7071068, -1.25, 0.0])
    advantages = values[:, None] * MASK.float()
    sent = per_row(Batch({"advantages": advantages, "response_mask": MASK}))
    assert "advantages" not in sent and sent["row_advantages"].tolist() == values.tolist()
    assert sent["row_advantages"].nbytes * MASK.shape[1] == advantages.nbytes  # 1/R of the bytes
    assert torch.equal(per_token(sent)["advantages"], advantages)


def test_token_varying_advantages_travel_as_they_are():
    advantages = torch.tensor([[0.5, 0.25, 0.0, 0.125], [1.0, 0.0, 0.0, 0.0], [0.0] * 4])  # returns
    batch = Batch({"advantages": advantages, "response_mask": MASK})
    assert per_row(batch)["advantages"] is advantages and "row_advantages" not in per_row(batch)
    off_mask = Batch({"advantages": torch.ones(3, 4), "response_mask": MASK})  # nonzero off the mask
    assert "row_advantages" not in per_row(off_mask)


def test_a_mask_the_driver_does_not_have_leaves_the_batch_as_it_is():
    held = Held(run="1.1", key="response_mask", rows=3, dp_size=1)  # on the workers only
    batch = Batch({"advantages": torch.zeros(3, 4)}, held={"response_mask": held})
    assert per_row(batch) is batch
