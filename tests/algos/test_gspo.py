"""GSPO's sequence-level loss against values worked out by hand in the comments."""

import math

import pytest
import torch

from dagrl.algos import compute_gspo_policy_loss

# The token log-ratios logprobs - old_logprobs below (_gspo puts them on old log-probs that differ
# from token to token, so a ratio that ignored them would show). Clip range [1 - 0.2, 1 + 0.05].
#   row  token log-ratios (mask)     mean   s = exp(mean)  A    -A*s       -A*clip(s)        max
#   0    0.3, -0.1, (pad)            0.1    1.105171       +1   -1.105171  -1.05             -1.05     clipped
#   1    -0.2, -0.4, -0.6            -0.4   0.670320       -2    1.340640   1.6 (s -> 0.8)    1.6      clipped
#   2    0.1, -0.3, (pad)            -0.1   0.904837       0.5  -0.452419  -0.452419         -0.452419
# loss = mean over rows = (-1.05 + 1.6 - 0.452419) / 3 = 0.097581 / 3 = 0.032527
LOG_RATIOS = [[0.3, -0.1, 9.0], [-0.2, -0.4, -0.6], [0.1, -0.3, -9.0]]
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0], [0.5, 0.5, 0.5]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])


def _gspo(log_ratios=LOG_RATIOS, advantages=ADVANTAGES, mask=MASK, low=0.2, high=0.05):
    ratios = torch.tensor(log_ratios)
    old = -0.25 * torch.arange(1, ratios.numel() + 1, dtype=ratios.dtype).reshape(ratios.shape)
    logprobs = (old + ratios).requires_grad_()
    loss, metrics = compute_gspo_policy_loss(old, logprobs, advantages, mask, low, high)
    loss.backward()
    return loss, metrics, logprobs.grad


def test_gspo_loss_and_metrics_by_hand():
    loss, metrics, _ = _gspo()
    assert loss.item() == pytest.approx(0.097581 / 3, abs=1e-6)
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(2 / 3)  # rows 0 and 1
    # token mean of old - new over the 7 valid tokens: -(0.3 - 0.1 - 0.2 - 0.4 - 0.6 + 0.1 - 0.3) / 7
    assert float(metrics["actor/ppo_kl"]) == pytest.approx(1.2 / 7, abs=1e-6)
    assert float(metrics["actor/seq_ratio_mean"]) == pytest.approx(
        (1.105171 + 0.670320 + 0.904837) / 3, abs=1e-6
    )
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_gspo_gradient_is_sequence_level():
    # clipped rows 0 and 1 get none; row 2's tokens share d(-A * s) / d logprob_t = -A * s / |y|,
    # divided by the 3 rows: -0.5 * 0.904837 / 2 / 3 = -0.075403 on each of its 2 tokens
    _, _, grad = _gspo()
    g = -0.5 * math.exp(-0.1) / 2 / 3
    torch.testing.assert_close(
        grad, torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [g, g, 0.0]]), atol=1e-6, rtol=0
    )


def test_gspo_ratio_is_length_normalised():
    # four tokens each with log-ratio 0.1: s = exp(0.1) (geometric mean), not exp(0.4);
    # with A = 1 and a wide clip range: loss = -exp(0.1) = -1.105171
    loss, metrics, _ = _gspo([[0.1] * 4], torch.ones(1, 4), torch.ones(1, 4), low=0.5, high=0.5)
    assert loss.item() == pytest.approx(-1.105171, abs=1e-6)
    assert float(metrics["actor/pg_clipfrac"]) == 0.0


def test_gspo_empty_response_contributes_zero():
    # row 1 has no tokens: s = 1, A = 0 -> loss 0; row 0 on-policy with A = 2 -> -2; mean = -1
    loss, _, grad = _gspo(
        [[0.0, 0.0], [5.0, 5.0]], torch.tensor([[2.0, 2.0], [3.0, 3.0]]), torch.tensor([[1, 1], [0, 0]])
    )
    assert loss.item() == pytest.approx(-1.0)
    # on-policy: -A * s / |y| / B = -2 / 2 / 2 = -0.5 per valid token, nothing for the empty row
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5], [0.0, 0.0]]))
