"""Distillation losses against hand-computed values, and the chunked / top-k forms against the
unchunked full-vocabulary reference (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from dagrl.algos.distillation import (
    divergence_from_logits,
    full_vocab_divergence,
    generalized_jsd,
    logprobs_at,
    map_token_chunks,
    reverse_kl_advantages,
    topk_divergence,
    topk_logprobs,
)
from dagrl.algos.losses import LossAggMode, agg_loss

LN = math.log


def kl(p, q):
    return sum(a * LN(a / b) for a, b in zip(p, q) if a > 0)


def jsd(p_s, p_t, beta):
    """The GKD paper's definition, written out with python floats."""
    if beta == 0:
        return kl(p_t, p_s)
    if beta == 1:
        return kl(p_s, p_t)
    m = [beta * t + (1 - beta) * s for s, t in zip(p_s, p_t)]
    return beta * kl(p_t, m) + (1 - beta) * kl(p_s, m)


def logs(p):
    return torch.tensor([LN(x) for x in p], dtype=torch.float64)


@pytest.mark.parametrize(
    "beta, expected",
    [
        # KL(t||s) = .25 ln(.25/.5) + .75 ln(.75/.5)
        (0.0, 0.25 * LN(0.5) + 0.75 * LN(1.5)),
        # KL(s||t) = .5 ln(.5/.25) + .5 ln(.5/.75)
        (1.0, 0.5 * LN(2) + 0.5 * LN(2 / 3)),
        # m = (.375, .625): .5 [.25 ln(.25/.375) + .75 ln(.75/.625)] + .5 [.5 ln(.5/.375) + .5 ln(.5/.625)]
        (0.5, 0.5 * (0.25 * LN(2 / 3) + 0.75 * LN(1.2)) + 0.5 * (0.5 * LN(4 / 3) + 0.5 * LN(0.8))),
    ],
)
def test_generalized_jsd_hand_values(beta, expected):
    student, teacher = logs([0.5, 0.5]), logs([0.25, 0.75])
    assert generalized_jsd(student, teacher, beta).item() == pytest.approx(expected, abs=1e-12)


def test_beta_between_weights_the_mixture_toward_the_teacher():
    p_s, p_t = [0.7, 0.2, 0.1], [0.1, 0.3, 0.6]
    got = generalized_jsd(logs(p_s), logs(p_t), 0.9).item()
    assert got == pytest.approx(jsd(p_s, p_t, 0.9), abs=1e-12)
    assert got != pytest.approx(jsd(p_s, p_t, 0.1), abs=1e-3)  # not symmetric in beta


def test_zero_probabilities_give_finite_values_and_gradients():
    student = torch.tensor([0.0, float("-inf")], dtype=torch.float64, requires_grad=True)
    teacher = logs([0.5, 0.5])
    for beta in (0.0, 0.5, 1.0):
        value = generalized_jsd(student, teacher, beta)
        (grad,) = torch.autograd.grad(value, student)
        assert torch.isfinite(grad).all()
    assert generalized_jsd(student, teacher, 1.0).item() == pytest.approx(LN(2))
    assert generalized_jsd(student, teacher, 0.0).item() == float("inf")  # the student misses a word


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_temperature_divides_both_logits(beta):
    # T = 2: student logits (0, ln 9) -> (0, ln 3) -> p = (1/4, 3/4); teacher (ln 4, 0) -> (ln 2, 0) -> (2/3, 1/3)
    student = torch.tensor([0.0, LN(9)], dtype=torch.float64)
    teacher = torch.tensor([LN(4), 0.0], dtype=torch.float64)
    got = divergence_from_logits(student, teacher, beta, temperature=2.0).item()
    assert got == pytest.approx(jsd([0.25, 0.75], [2 / 3, 1 / 3], beta), abs=1e-7)


def random_case(seed, b=3, t=5, v=11, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(b, t, v, generator=g, dtype=dtype) * 2
    teacher = torch.randn(b, t, v, generator=g, dtype=dtype) * 2
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])[:b, :t]
    weights = torch.randn(b, t, generator=g, dtype=dtype)
    return student, teacher, mask, weights


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_full_vocab_equals_unchunked_values_and_gradient(beta, temperature):
    student, teacher, mask, weights = random_case(0)
    ours = student.clone().requires_grad_()
    per_token = full_vocab_divergence(ours, teacher, mask, beta, temperature, chunk_tokens=3)
    (per_token * weights).sum().backward()
    ref = student.clone().requires_grad_()
    expected = divergence_from_logits(ref, teacher, beta, temperature) * mask
    (expected * weights).sum().backward()
    torch.testing.assert_close(per_token.double(), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=0, atol=1e-6)
    assert (per_token[mask == 0] == 0).all() and (per_token[mask == 1] > 0).all()
    assert ours.grad[mask == 0].abs().max() == 0, "masked tokens get no gradient"


def test_chunked_full_vocab_with_bf16_logits_keeps_their_dtype_for_the_gradient():
    student, teacher, mask, _ = random_case(1, dtype=torch.bfloat16)
    ours = student.clone().requires_grad_()
    full_vocab_divergence(ours, teacher, mask, 0.5, chunk_tokens=2).sum().backward()
    assert ours.grad.dtype == torch.bfloat16
    ref = student.float().requires_grad_()
    (divergence_from_logits(ref, teacher, 0.5, 1.0) * mask).sum().backward()
    torch.testing.assert_close(ours.grad.float(), ref.grad, rtol=0, atol=2e-2)


def test_map_token_chunks_reaches_shared_weights_and_repeated_rows():
    """An output layer applied chunk by chunk: gradients to the hidden states and the shared weight."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(6, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64)
    rows = torch.tensor([5, 0, 2, 2, 3])  # row 2 twice: its gradient is the sum
    coef = torch.randn(5, generator=g, dtype=torch.float64)

    def logsumexp_of_projection(h, w):
        return torch.logsumexp(h @ w.T, dim=-1)

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    (map_token_chunks(logsumexp_of_projection, [(h1, rows)], [w1], chunk_tokens=2) * coef).sum().backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    (logsumexp_of_projection(h2[rows], w2) * coef).sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


def test_topk_hand_values_renormalised_and_tail_bucket():
    # p_t = (.5, .3, .2), p_s = (.2, .3, .5); the teacher's top-2 ids are 0 and 1.
    p_t, p_s = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    ids = torch.tensor([[[0, 1]]])
    teacher = logs(p_t)[ids]
    student = logs(p_s)[ids]
    mask = torch.ones(1, 1)
    renorm = topk_divergence(student, teacher, mask, beta=0.0).item()
    assert renorm == pytest.approx(kl([0.625, 0.375], [0.4, 0.6]), abs=1e-9)
    tail = topk_divergence(student, teacher, mask, beta=0.0, tail_bucket=True).item()
    assert tail == pytest.approx(kl([0.5, 0.3, 0.2], [0.2, 0.3, 0.5]), abs=1e-9)  # K+1 = V here
    ids = torch.tensor([[[0]]])  # top-1: renormalised, one word is certain; the tail keeps (.5 | .2)
    assert topk_divergence(logs(p_s)[ids], logs(p_t)[ids], mask, 0.0).item() == 0
    tail = topk_divergence(logs(p_s)[ids], logs(p_t)[ids], mask, 0.5, tail_bucket=True).item()
    assert tail == pytest.approx(jsd([0.2, 0.8], [0.5, 0.5], 0.5), abs=1e-9)


@pytest.mark.parametrize("tail_bucket", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_topk_with_k_equal_vocabulary_is_the_full_vocabulary_loss(tail_bucket, beta):
    student, teacher, mask, weights = random_case(3)
    ids, teacher_lp = topk_logprobs(teacher, k=teacher.shape[-1], temperature=0.8)
    ours = student.clone().requires_grad_()
    per_token = topk_divergence(logprobs_at(ours, ids, 0.8), teacher_lp, mask, beta, tail_bucket)
    (per_token * weights).sum().backward()
    ref = student.clone().requires_grad_()
    expected = full_vocab_divergence(ref, teacher, mask, beta, 0.8)
    (expected * weights).sum().backward()
    torch.testing.assert_close(per_token.double(), expected.double(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=0, atol=1e-6)


def test_topk_logprobs_are_the_largest_full_vocabulary_logprobs():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    ids, values = topk_logprobs(logits, 2, temperature=2.0)
    assert ids.tolist() == [[1, 2]]
    z = torch.tensor([0.5, 1.5, 1.0, -0.5])
    torch.testing.assert_close(values[0], z[[1, 2]] - torch.logsumexp(z, 0))


def test_aggregation_over_the_response_mask():
    per_token = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert agg_loss(per_token, mask, LossAggMode.token_mean).item() == pytest.approx(2.0)
    assert agg_loss(per_token, mask, LossAggMode.seq_mean_token_mean).item() == pytest.approx(2.0)
    assert agg_loss(per_token, mask, LossAggMode.seq_mean_token_sum).item() == pytest.approx(3.0)


def test_reverse_kl_advantages_values_mask_and_stop_gradient():
    student = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    adv = reverse_kl_advantages(student, teacher, mask, coef=2.0)
    assert adv.tolist() == [[-1.0, 2.0, 0.0]]  # -2 (s - t) on the first two tokens
    assert not adv.requires_grad


def test_reverse_kl_reward_gives_the_reverse_kl_gradient_and_k1_alone_gives_zero():
    """Exact expectations over a 5-word vocabulary at one position."""
    g = torch.Generator().manual_seed(4)
    z = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    student = torch.log_softmax(z, 0)
    probs = student.exp().detach()
    (true_grad,) = torch.autograd.grad(generalized_jsd(student, teacher, 1.0), z, retain_graph=True)
    adv = reverse_kl_advantages(student.detach()[None], teacher[None], torch.ones(1, 5))[0]
    # policy gradient loss -A * log pi(y), in expectation over y ~ pi
    (pg_grad,) = torch.autograd.grad((probs * -adv * student).sum(), z, retain_graph=True)
    torch.testing.assert_close(pg_grad, true_grad)
    # backpropagating k1 = log pi_s(y) - log pi_t(y) itself: expected gradient is zero
    (k1_grad,) = torch.autograd.grad((probs * (student - teacher)).sum(), z)
    torch.testing.assert_close(k1_grad, torch.zeros(5, dtype=torch.float64))
    assert true_grad.abs().max() > 1e-3
