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
    # policy, observation (value 9 ignored), policy; gamma = lambda = 1, reward 1 at the end:
    # t=2: A = 1 - 0.7 = 0.3; the observation passes A and V_next = 0.7 on;
    # t=0: delta = 0.7 - 0.5 = 0.2, A = 0.2 + 0.3 = 0.5 = R - V_0. returns [1, 0, 1]
    _, ret = compute_gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.7]]), torch.tensor([[1, 0, 1]]), 1.0, 1.0
    )
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0]]))


def test_clipped_value_loss():
    # new [1, 0], old [0.5, 0.5], returns [1, 1], clip 0.2: clipped new [0.7, 0.3];
    # unclipped errors [0, 1], clipped [0.09, 0.49]; max [0.09, 1]; token-mean 0.545; x 0.5 = 0.2725.
    # the clipped error is larger on token 0 only: clipfrac 0.5
    loss, metrics = compute_value_loss(
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[0.5, 0.5]]),
        torch.tensor([[1.0, 1.0]]),
        torch.ones(1, 2),
        0.2,
    )
    assert float(loss) == pytest.approx(0.2725)
    assert float(metrics["critic/vf_clipfrac"]) == pytest.approx(0.5)
