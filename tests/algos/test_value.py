"""GAE and the clipped value loss against values worked out by hand in the comments."""

import pytest
import torch

from dagrl.algos.value import compute_gae_advantages, compute_value_loss


def test_gae_one_row():
    # rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 1, lambda 0.5:
    # t=2: delta = 1 - 0.7 = 0.3, A = 0.3; t=1: delta = 0.7 - 0.6 = 0.1, A = 0.1 + 0.5 x 0.3 = 0.25;
    # t=0: delta = 0.6 - 0.5 = 0.1, A = 0.1 + 0.5 x 0.25 = 0.225; returns = A + V = [0.725, 0.85, 1.0]
    # whitened [0.225, 0.25, 0.3]: mean 0.258333, unbiased var 0.00291667 / 2 = 0.00145833,
    # std 0.0381881 -> [-0.872872, -0.218218, 1.091089]
    adv, ret = compute_gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3), gamma=1.0, lam=0.5
    )
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0]]))
    torch.testing.assert_close(adv, torch.tensor([[-0.872872, -0.218218, 1.091089]]), atol=1e-4, rtol=0)


def test_gae_skips_observation_tokens():
    # policy, observation (value 9 ignored), policy; gamma 0.5, lambda 1, reward 1 at the end:
    # t=2: A = 1 - 0.7 = 0.3; the observation passes A and V_next = 0.7 on, undiscounted;
    # t=0: delta = 0.5 x 0.7 - 0.5 = -0.15, A = -0.15 + 0.5 x 0.3 = 0, returns [0.5, 0, 1]
    # (the discounted return 0.5 x 1 with one discount per policy token). A step through the
    # observation would give t=1: delta = 0.35 - 9, A = -8.5; t=0: A = 4 - 4.25, returns[0] 0.25
    # (with gamma = lambda = 1 GAE telescopes to R - V_0 and cannot tell the two apart)
    _, ret = compute_gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.7]]), torch.tensor([[1, 0, 1]]), 0.5, 1.0
    )
    torch.testing.assert_close(ret, torch.tensor([[0.5, 0.0, 1.0]]))


def test_clipped_value_loss():
    # new [1, 0, 0, 0.6], old 0.5, returns [1, 1, 0, 1], clip 0.2: clipped new [0.7, 0.3, 0.3, 0.6]
    # (held above and below the old value; the last token moved less than the clip);
    # unclipped errors [0, 1, 0, 0.16], clipped [0.09, 0.49, 0.09, 0.16]; max [0.09, 1, 0.09, 0.16];
    # token-mean 1.34 / 4; x 0.5 = 0.1675.
    # the clipped error is larger on tokens 0 and 2 (equal on the last): clipfrac 2/4
    loss, metrics = compute_value_loss(
        torch.tensor([[1.0, 0.0, 0.0, 0.6]]),
        torch.full((1, 4), 0.5),
        torch.tensor([[1.0, 1.0, 0.0, 1.0]]),
        torch.ones(1, 4),
        0.2,
    )
    assert float(loss) == pytest.approx(0.5 * 1.34 / 4)
    assert float(metrics["critic/vf_clipfrac"]) == pytest.approx(0.5)
