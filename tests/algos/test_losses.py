"""Losses, KL estimators and log-prob helpers against values worked out by hand in the comments."""

import math

import pytest
import torch

from dagrl.algos import (
    KLEstimator,
    LossAggMode,
    agg_loss,
    compute_policy_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    seq_mean_token_sum_norm,
)

# --- masked_mean / agg_loss --------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    assert masked_mean(x, mask).item() == pytest.approx(8 / 3)  # (1 + 3 + 4) / 3
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.0, 3.5])  # [1/1, (3 + 4)/2]
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_loss_agg_mode_from_string():
    assert LossAggMode("token-mean") is LossAggMode.token_mean
    assert LossAggMode("seq-mean-token-sum") is LossAggMode.seq_mean_token_sum


@pytest.mark.parametrize(
    "mode, expected",
    [
        (LossAggMode.token_mean, 7 / 3),  # valid tokens 1, 2, 4 -> 7 / 3
        (LossAggMode.seq_mean_token_sum, 3.5),  # row sums 3 and 4 -> mean 3.5
        (LossAggMode.seq_mean_token_mean, 2.75),  # row means 1.5 and 4 -> mean 2.75
    ],
)
def test_agg_loss_modes(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "mode, expected",
    [
        (LossAggMode.token_mean, 1.5),  # tokens 1, 2 -> 3 / 2
        (LossAggMode.seq_mean_token_sum, 1.5),  # row sums 3 and 0 -> 1.5
        (LossAggMode.seq_mean_token_mean, 0.75),  # row means 1.5 and 0 (empty) -> 0.75
    ],
)
def test_agg_loss_empty_row(mode, expected):
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert agg_loss(LOSS, mask, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", list(LossAggMode))
def test_agg_loss_empty_mask_is_zero(mode):
    assert agg_loss(LOSS, torch.zeros(2, 3), mode, norm_length=5).item() == 0.0


def test_seq_mean_token_sum_norm_by_hand():
    # row sums 1 + 2 = 3 and 4 -> mean 3.5 -> over the constant 5: 0.7 (the padded width 3 is not used)
    assert seq_mean_token_sum_norm(LOSS, MASK, 5).item() == pytest.approx(0.7)
    assert agg_loss(LOSS, MASK, LossAggMode.seq_mean_token_sum_norm, 5).item() == pytest.approx(0.7)
    # every valid token weighs 1 / (B * norm_length) = 1 / 10, in the short response as in the long one
    loss_mat = LOSS.clone().requires_grad_()
    seq_mean_token_sum_norm(loss_mat, MASK, 5).backward()
    torch.testing.assert_close(loss_mat.grad, torch.tensor([[0.1, 0.1, 0.0], [0.1, 0.0, 0.0]]))


def test_loss_agg_mode_accepts_names_and_verl_spellings():
    assert LossAggMode["seq-mean-token-sum-norm"] is LossAggMode.seq_mean_token_sum_norm
    assert LossAggMode["seq_mean_token_sum_norm"] is LossAggMode.seq_mean_token_sum_norm
    with pytest.raises(KeyError):
        LossAggMode["token-sum"]


# --- KL estimators -----------------------------------------------------------------------------

# d = logp - ref = [1, -1]
LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-2.0, -1.0]])


@pytest.mark.parametrize(
    "estimator, expected",
    [
        (KLEstimator.k1, [1.0, -1.0]),  # d
        (KLEstimator.k2, [0.5, 0.5]),  # d^2 / 2
        # exp(-d) + d - 1: exp(-1) + 1 - 1 = 0.367879, exp(1) - 1 - 1 = 0.718282
        (KLEstimator.k3, [0.367879, 0.718282]),
        (KLEstimator.abs, [1.0, 1.0]),  # |d|
    ],
)
def test_kl_estimators(estimator, expected):
    assert kl_penalty(LOGP, REF, estimator)[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_k3_is_clamped():
    # ref - logp = 30 -> clamped to 20 -> exp(20) - 21 ~ 4.9e8 -> clamped to 10
    # ref - logp = -30 -> clamped to -20 -> exp(-20) + 19 ~ 19 -> clamped to 10
    logp = torch.tensor([[0.0, 30.0]])
    ref = torch.tensor([[30.0, 0.0]])
    assert kl_penalty(logp, ref, KLEstimator.k3)[0].tolist() == [10.0, 10.0]


def test_kl_estimator_parse():
    assert KLEstimator.parse("low_var_kl") is KLEstimator.k3
    assert KLEstimator.parse("kl") is KLEstimator.k1
    assert KLEstimator.parse("mse") is KLEstimator.k2
    assert KLEstimator.parse("abs") is KLEstimator.abs
    assert KLEstimator.parse("k2") is KLEstimator.k2
    with pytest.raises(ValueError, match="low_var_kl"):
        KLEstimator.parse("full")


# --- PPO policy loss ---------------------------------------------------------------------------
# old_logprobs = 0, so ratio = exp(logprobs). Clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28], c = 3.
#   token  ratio  A   -A*ratio  -A*clip(ratio)  max    dual-clip min(., -A*3)  grad flows?
#   (0,0)  1.5   +1   -1.5      -1.28           -1.28  -                      no  (clipped high)
#   (0,1)  0.5   +1   -0.5      -0.8            -0.5   -                      yes
#   (0,2)  0.5   -1    0.5       0.8             0.8   min(0.8, 3) = 0.8      no  (clipped low)
#   (1,0)  5.0   -1    5.0       1.28            5.0   min(5.0, 3) = 3.0      no  (dual clip)
#   (1,1)  1.1   -2    2.2       2.2             2.2   min(2.2, 6) = 2.2      yes
#   (1,2)  masked
# token-mean loss = (-1.28 - 0.5 + 0.8 + 3.0 + 2.2) / 5 = 4.22 / 5 = 0.844
RATIOS = [[1.5, 0.5, 0.5], [5.0, 1.1, 1.0]]
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0], [-1.0, -2.0, 10.0]])
PG_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _policy_loss(mode=LossAggMode.token_mean, clip_ratio_c=3.0):
    logprobs = torch.tensor(RATIOS).log().requires_grad_()
    loss, metrics = compute_policy_loss(
        torch.zeros(2, 3), logprobs, ADVANTAGES, PG_MASK, 0.2, 0.28, mode, clip_ratio_c=clip_ratio_c
    )
    loss.backward()
    return loss, metrics, logprobs.grad


def test_policy_loss_value_and_metrics():
    loss, metrics, _ = _policy_loss()
    assert loss.item() == pytest.approx(0.844, abs=1e-5)
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(2 / 5)  # tokens (0,0) and (0,2)
    assert float(metrics["actor/pg_clipfrac_lower"]) == pytest.approx(1 / 5)  # token (1,0)
    # -mean(log 1.5 + log 0.5 + log 0.5 + log 5 + log 1.1) = -(0.405465 - 2 * 0.693147 + 1.609438 + 0.095310) / 5
    assert float(metrics["actor/ppo_kl"]) == pytest.approx(-0.723919 / 5, abs=1e-5)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_policy_loss_gradients_zero_on_clipped_tokens():
    # d(-A * ratio) / d logprob = -A * ratio, divided by the 5 valid tokens:
    # (0,1): -0.5 / 5 = -0.1; (1,1): 2.2 / 5 = 0.44; clipped, dual-clipped and masked tokens: 0
    _, _, grad = _policy_loss()
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.1, 0.0], [0.0, 0.44, 0.0]]), atol=1e-6, rtol=0)


def test_policy_loss_without_dual_clip():
    # token (1,0) keeps 5.0: (4.22 - 3.0 + 5.0) / 5 = 1.244; its grad is -A * ratio / 5 = 5 / 5 = 1
    loss, metrics, grad = _policy_loss(clip_ratio_c=None)
    assert loss.item() == pytest.approx(1.244, abs=1e-5)
    assert float(metrics["actor/pg_clipfrac_lower"]) == 0.0
    assert grad[1, 0].item() == pytest.approx(1.0, abs=1e-5)


def test_policy_loss_seq_mean_token_sum():
    # row sums: -1.28 - 0.5 + 0.8 = -0.98 and 3.0 + 2.2 = 5.2 -> mean 2.11
    loss, _, _ = _policy_loss(mode=LossAggMode.seq_mean_token_sum)
    assert loss.item() == pytest.approx(2.11, abs=1e-5)


def test_policy_loss_dr_grpo_constant_length():
    # the same row sums over the constant 4 (Dr. GRPO): 2.11 / 4 = 0.5275; an unclipped token's
    # grad is -A * ratio / (B * 4): (0,1): -0.5 / 8 = -0.0625, (1,1): 2.2 / 8 = 0.275
    logprobs = torch.tensor(RATIOS).log().requires_grad_()
    mode = LossAggMode.seq_mean_token_sum_norm
    loss, _ = compute_policy_loss(torch.zeros(2, 3), logprobs, ADVANTAGES, PG_MASK, 0.2, 0.28, mode, 3.0, 4)
    loss.backward()
    assert loss.item() == pytest.approx(0.5275, abs=1e-5)
    expected = torch.tensor([[0.0, -0.0625, 0.0], [0.0, 0.275, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_policy_loss_on_policy_is_minus_mean_advantage():
    # ratio = 1 everywhere: nothing clips, loss = -mean(A) = -(1 - 1 + 2) / 3
    logprobs = torch.tensor([[-0.3, -1.2, -2.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, metrics = compute_policy_loss(
        logprobs, logprobs, adv, torch.ones(1, 3), 0.2, 0.2, LossAggMode.token_mean
    )
    assert loss.item() == pytest.approx(-2 / 3)
    assert float(metrics["actor/pg_clipfrac"]) == 0.0
    assert float(metrics["actor/ppo_kl"]) == 0.0


@pytest.mark.parametrize("bad_c", [1.0, 0.5])
def test_policy_loss_rejects_dual_clip_bound_not_above_one(bad_c):
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _policy_loss(clip_ratio_c=bad_c)


# --- log-probs and entropy from logits ---------------------------------------------------------


def test_logprobs_and_entropy_by_hand():
    # logits [0, ln 3] -> probs [1/4, 3/4]; log p(label 1) = ln 0.75 = -0.287682
    # entropy = 0.25 * ln 4 + 0.75 * ln(4/3) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    logprobs = logprobs_from_logits(logits, torch.tensor([[1]]))
    assert logprobs.item() == pytest.approx(-0.287682, abs=1e-6)
    assert entropy_from_logits(logits).item() == pytest.approx(0.562335, abs=1e-6)
    # d log softmax(l)[1] / dl = onehot(1) - probs = [-0.25, 0.25]
    logprobs.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.25, 0.25]]]))


def test_logprobs_and_entropy_match_categorical():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 3
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), dist.log_prob(labels))
    torch.testing.assert_close(entropy_from_logits(logits), dist.entropy())


def test_uniform_logits_entropy_is_log_vocab():
    entropy = entropy_from_logits(torch.full((2, 3, 7), 0.4))
    torch.testing.assert_close(entropy, torch.full((2, 3), math.log(7)))


def test_bf16_logits_give_float32_and_gradients():
    logits = torch.randn(2, 4, 9).to(torch.bfloat16).requires_grad_()
    labels = torch.zeros(2, 4, dtype=torch.long)
    logprobs = logprobs_from_logits(logits, labels)
    entropy = entropy_from_logits(logits)
    assert logprobs.dtype == entropy.dtype == torch.float32
    assert logprobs.shape == entropy.shape == (2, 4)
    (logprobs.sum() + entropy.sum()).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
