"""Vocabulary-parallel distillation functions: TP2 (two gloo ranks, 35 columns each of a 64-word
vocabulary padded to 70) equals TP1 and the plain full-vocabulary math, values and gradients."""

from __future__ import annotations

import pytest
import torch

from dagrl.algos.distillation import divergence_from_logits, logprobs_at, topk_logprobs
from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")

VOCAB, COLS, K = 64, 70, 5


def case(seed: int = 0, seq=7, batch=3, tokens=12):
    """Student logits [S, B, COLS], teacher logits [S+2, B, COLS] (a longer OPSD prompt), the
    selected student and teacher coordinates, ids to score, and gradient weights."""
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(seq, batch, COLS, generator=g, dtype=torch.float64) * 3
    teacher = torch.randn(seq + 2, batch, COLS, generator=g, dtype=torch.float64) * 3
    picked = torch.randperm(seq * batch, generator=g)[:tokens]
    rows, positions = picked % batch, picked // batch
    ids = torch.randint(0, VOCAB, (tokens, K), generator=g)
    weights = (
        torch.randn(tokens, K, generator=g, dtype=torch.float64),
        torch.randn(tokens, generator=g, dtype=torch.float64),
    )
    return student, teacher, (rows, positions), (rows, positions + 2), ids, weights


def compute(student, teacher, s_coords, t_coords, ids, weights, group, beta):
    from dagrl.backends.megatron.distillation import (
        vocab_parallel_divergence,
        vocab_parallel_logprobs_at,
        vocab_parallel_topk,
    )

    top_ids, top_lp = vocab_parallel_topk(teacher, *t_coords, K, 0.8, VOCAB, group, chunk_tokens=5)
    s = student.clone().requires_grad_()
    at = vocab_parallel_logprobs_at(s, *s_coords, ids, 0.8, VOCAB, group, chunk_tokens=5)
    div = vocab_parallel_divergence(s, s_coords, teacher, t_coords, beta, 0.8, VOCAB, group, chunk_tokens=5)
    ((at * weights[0]).sum() + (div * weights[1]).sum()).backward()
    return top_ids, top_lp, at.detach(), div.detach(), s.grad


def _tp_rank(rank: int, world: int, seed: int, beta: float):
    student, teacher, s_coords, t_coords, ids, weights = case(seed)
    width = COLS // world
    cols = slice(rank * width, (rank + 1) * width)
    return compute(
        student[..., cols].contiguous(), teacher[..., cols].contiguous(), s_coords, t_coords, ids, weights,
        torch.distributed.group.WORLD, beta,
    )  # fmt: skip


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_tp1_matches_plain_full_vocabulary_math(beta):
    student, teacher, s_coords, t_coords, ids, weights = case(1)
    top_ids, top_lp, at, div, grad = compute(student, teacher, s_coords, t_coords, ids, weights, None, beta)
    t_rows = teacher[t_coords[1], t_coords[0], :VOCAB]
    ref_ids, ref_lp = topk_logprobs(t_rows, K, 0.8)
    assert torch.equal(top_ids, ref_ids)
    torch.testing.assert_close(top_lp, ref_lp)
    ref = student.clone().requires_grad_()
    r_rows = ref[s_coords[1], s_coords[0], :VOCAB]
    ref_at = logprobs_at(r_rows, ids, 0.8)
    ref_div = divergence_from_logits(r_rows, t_rows, beta, 0.8)
    ((ref_at * weights[0]).sum() + (ref_div * weights[1]).sum()).backward()
    torch.testing.assert_close(at, ref_at.detach())
    torch.testing.assert_close(div, ref_div.detach())
    torch.testing.assert_close(grad, ref.grad)
    assert grad[..., VOCAB:].abs().max() == 0, "vocabulary padding gets no gradient"


@pytest.mark.parametrize("beta", [0.3, 1.0])  # two gloo processes per case: ~40 s each on 2 cores
def test_tp2_equals_tp1(beta):
    student, teacher, s_coords, t_coords, ids, weights = case(2)
    top_ids, top_lp, at, div, grad = compute(student, teacher, s_coords, t_coords, ids, weights, None, beta)
    ranks = run_distributed(_tp_rank, 2, 2, beta)
    for r_ids, r_lp, r_at, r_div, _ in ranks:
        assert torch.equal(r_ids, top_ids)
        torch.testing.assert_close(r_lp, top_lp)
        torch.testing.assert_close(r_at, at)
        torch.testing.assert_close(r_div, div)
    torch.testing.assert_close(torch.cat([r[4] for r in ranks], dim=-1), grad)
    assert (top_ids >= 35).any() and (top_ids < 35).any(), "the top-K merge draws from both shards"


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_hidden_divergence_and_topk_match_the_teachers_full_logits(beta):
    """The teacher's logits made chunk by chunk from its hidden states [N, H'] and output-layer rows
    [COLS, H'] (rows past the vocabulary are padding) equal the full-logits math, with gradients."""
    from dagrl.backends.megatron.distillation import (
        vocab_parallel_hidden_divergence,
        vocab_parallel_topk_from_hidden,
    )

    student, _, s_coords, _, _, weights = case(3)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(len(s_coords[0]), 6, generator=g, dtype=torch.float64)
    head = torch.randn(COLS, 6, generator=g, dtype=torch.float64) * 2
    bias = torch.randn(COLS, generator=g, dtype=torch.float64)
    t_rows = (hidden @ head.T + bias)[:, :VOCAB]
    ids, lp = vocab_parallel_topk_from_hidden(hidden, (head, bias), K, 0.8, VOCAB, chunk_tokens=5)
    ref_ids, ref_lp = topk_logprobs(t_rows, K, 0.8)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(lp, ref_lp)
    s = student.clone().requires_grad_()
    div = vocab_parallel_hidden_divergence(
        s, s_coords, hidden, (head, bias), beta, 0.8, VOCAB, chunk_tokens=5
    )
    (div * weights[1]).sum().backward()
    ref = student.clone().requires_grad_()
    ref_div = divergence_from_logits(ref[s_coords[1], s_coords[0], :VOCAB], t_rows, beta, 0.8)
    (ref_div * weights[1]).sum().backward()
    assert ref_div.min() > 0
    torch.testing.assert_close(div, ref_div.detach())
    torch.testing.assert_close(s.grad, ref.grad)
