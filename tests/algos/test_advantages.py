"""GRPO advantages against values worked out by hand in the comments."""

import pytest
import torch

from dagrl.algos import compute_grpo_advantages

# 1 / sqrt(2): the normalised deviation of either member of a two-sample group with distinct scores,
# since |x - mean| = d/2 and the unbiased std is sqrt(2 * (d/2)^2 / 1) = d / sqrt(2).
INV_SQRT2 = 0.7071068


def _adv(scores, group_ids, norm_by_std=True, mask=None):
    scores = torch.tensor(scores, dtype=torch.float32)
    mask = torch.ones(len(scores), 1) if mask is None else torch.tensor(mask)
    return compute_grpo_advantages(scores, torch.tensor(group_ids), mask, norm_by_std=norm_by_std)


def test_two_groups_of_two():
    # group 0: scores [1, 0], mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.7071 -> +-0.7071
    # group 1: scores [1, 1], mean 1, std 0 -> 0 / eps = 0
    adv = _adv([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    assert adv.shape == (4, 1)
    assert adv[:, 0].tolist() == pytest.approx([INV_SQRT2, -INV_SQRT2, 0.0, 0.0], abs=1e-5)


def test_without_std_normalisation():
    # same groups, only the mean is removed: [1 - 0.5, 0 - 0.5, 0, 0]
    adv = _adv([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], norm_by_std=False)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_group_of_three():
    # scores [0, 1, 2]: mean 1, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> [-1, 0, 1]
    adv = _adv([0.0, 1.0, 2.0], [5, 5, 5])
    assert adv[:, 0].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)


def test_interleaved_non_contiguous_ids():
    # id 7: scores [1, 0] -> [+0.7071, -0.7071]; id 3: scores [2, 4], mean 3, std sqrt(2) -> [-0.7071, +0.7071]
    adv = _adv([1.0, 2.0, 0.0, 4.0], [7, 3, 7, 3])
    assert adv[:, 0].tolist() == pytest.approx([INV_SQRT2, -INV_SQRT2, -INV_SQRT2, INV_SQRT2], abs=1e-5)


def test_singleton_group_uses_mean_zero_std_one():
    # id 9 alone: (0.5 - 0) / (1 + eps) = 0.5; id 1: [1, 0] -> +-0.7071
    adv = _adv([0.5, 1.0, 0.0], [9, 1, 1])
    assert adv[:, 0].tolist() == pytest.approx([0.5, INV_SQRT2, -INV_SQRT2], abs=1e-5)


def test_broadcast_over_tokens_and_masked():
    # scores [3, 1] in one group: mean 2, std sqrt(2) -> [+0.7071, -0.7071] on every unmasked token
    mask = [[1, 1, 0], [1, 0, 0]]
    adv = _adv([3.0, 1.0], [0, 0], mask=mask)
    assert adv.shape == (2, 3)
    assert adv.dtype == torch.float32
    expected = [[INV_SQRT2, INV_SQRT2, 0.0], [-INV_SQRT2, 0.0, 0.0]]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-5, rtol=0)
