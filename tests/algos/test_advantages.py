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


def test_turn_advantages_are_group_normalised_rewards_to_go():
    """Per-turn credit (DeepSeekMath §4.1.3 with turns as steps). One group: episode 0 played two
    turns rewarded [1, 0], episode 1 one turn rewarded [0] (its second cell is not played).
    Played rewards {1, 0, 0}: mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3);
    normalised: 1 -> (2/3)/sqrt(1/3) = 1.1547, 0 -> -0.5774. Reward-to-go: episode 0's first
    turn 1.1547 - 0.5774 = 0.5774, its second -0.5774; episode 1's only turn -0.5774."""
    from dagrl.algos.advantages import compute_turn_advantages, place_turn_rewards

    turn_rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    # episode 0: turn 0 (2 policy tokens, 1 observation token), turn 1 (1 policy token), padding
    turn_ids = torch.tensor([[0, 0, 0, 1, -1], [0, 0, -1, -1, -1]])
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 0, 0]])
    adv = compute_turn_advantages(turn_rewards, turn_ids, mask, torch.tensor([7, 7]))
    s = 0.5773503
    expected = torch.tensor([[s, s, 0, -s, 0], [-s, -s, 0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    # without the std (Dr. GRPO): deviations 2/3, -1/3, -1/3 -> to-go 1/3, -1/3; -1/3
    adv = compute_turn_advantages(turn_rewards, turn_ids, mask, torch.tensor([7, 7]), norm_by_std=False)
    t = 1 / 3
    torch.testing.assert_close(adv, torch.tensor([[t, t, 0, -t, 0], [-t, -t, 0, 0, 0]]), atol=1e-6, rtol=0)
    # each turn's reward on the last policy token of its turn (not on the observation after it)
    placed = place_turn_rewards(torch.tensor([[0.5, 2.0], [3.0, 0.0]]), turn_ids, mask)
    assert placed.tolist() == [[0.0, 0.5, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 0.0, 0.0]]
    # a one-token turn in column 0 keeps its reward there (its last policy token is column 0)
    first = place_turn_rewards(
        torch.tensor([[0.5, 2.0]]), torch.tensor([[0, -1, 1, 1]]), torch.tensor([[1, 0, 1, 1]])
    )
    assert first.tolist() == [[0.5, 0.0, 0.0, 2.0]]


def test_grpo_advantages_unchanged_by_the_shared_normalisation():
    """compute_grpo_advantages now normalises through the helper the turn credit uses."""
    adv = _adv([1.0, 0.0, 3.0, 3.0, 5.0], [0, 0, 1, 1, 2])
    torch.testing.assert_close(adv[:, 0], torch.tensor([INV_SQRT2, -INV_SQRT2, 0.0, 0.0, 5.0 / (1 + 1e-6)]))
