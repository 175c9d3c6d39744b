"""DAPO's overlong penalty and group filter against values worked out by hand in the comments."""

import torch

from dagrl.algos.dapo import overlong_penalty, varied_groups


def test_overlong_penalty_is_zero_before_the_buffer_then_linear():
    # limit 16, buffer 4 (expected 12), factor 1: lengths 10, 12 -> 0; 13 -> -1/4; 14 -> -2/4; 16 -> -1
    got = overlong_penalty(torch.tensor([10, 12, 13, 14, 16]), 16, 4, 1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    # factor 0.5 halves it: 14 -> -0.25, 16 -> -0.5
    got = overlong_penalty(torch.tensor([14, 16]), 16, 4, 0.5)
    torch.testing.assert_close(got, torch.tensor([-0.25, -0.5]))


def test_varied_groups_drops_groups_of_equal_rewards():
    # group 3: [1, 1, 1] all equal -> dropped; group 5: [0, 1] kept; group 8: [0, 0] dropped;
    # group 9 alone: kept (verl's choice)
    values = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.5, 1.0])
    groups = torch.tensor([3, 5, 3, 8, 3, 8, 9, 5])
    assert varied_groups(values, groups).tolist() == [False, True, False, False, False, False, True, True]
