"""The fused response log-prob / entropy function against float64 torch math: values and
gradients, temperature, vocabulary padding, a vocabulary split over two gloo ranks, and the
Triton kernels themselves under Triton's CPU interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")


def reference(logits, rows, positions, targets, temperature, vocab):
    """float64 log p(targets) and entropy at the selected [S, B] positions (padding columns dropped)."""
    z = logits[positions, rows].double()[:, :vocab] / temperature
    lse = torch.logsumexp(z, dim=-1)
    logprobs = z.gather(1, targets[:, None]).squeeze(1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logprobs, entropy


def case(seed: int, seq=9, rows=4, cols=70, vocab=64, tokens=20):
    """Random logits [S, B, cols] (columns past `vocab` are TP padding), distinct positions."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(seq, rows, cols, generator=g) * 4
    picked = torch.randperm(seq * rows, generator=g)[:tokens]
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    grads = torch.randn(2, tokens, generator=g, dtype=torch.float64)
    return logits, picked % rows, picked // rows, targets, grads


def fused_and_reference(seed: int, temperature: float, entropy: bool, cols=70, vocab=64):
    from dagrl.backends.logprob_kernel import response_logprobs

    logits, rows, positions, targets, (g_lp, g_ent) = case(seed, cols=cols, vocab=vocab)
    ours = logits.clone().requires_grad_()
    out = response_logprobs(ours, rows, positions, targets, temperature, vocab, entropy)
    logprobs, ent = out if entropy else (out, None)
    (logprobs.double() * g_lp + (ent.double() * g_ent if entropy else 0)).sum().backward()
    theirs = logits.clone().double().requires_grad_()
    ref_lp, ref_ent = reference(theirs, rows, positions, targets, temperature, vocab)
    (ref_lp * g_lp + (ref_ent * g_ent if entropy else 0)).sum().backward()
    return (logprobs, ent, ours.grad), (ref_lp, ref_ent if entropy else None, theirs.grad)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy", [True, False])
def test_matches_float64_math(temperature, entropy):
    (lp, ent, grad), (ref_lp, ref_ent, ref_grad) = fused_and_reference(0, temperature, entropy)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=2e-5)
    if entropy:
        torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=2e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=2e-5)
    assert grad[..., 64:].abs().max() == 0, "vocabulary padding must get no gradient"


def test_unselected_positions_get_exactly_zero_gradient():
    from dagrl.backends.logprob_kernel import response_logprobs

    logits, rows, positions, targets, _ = case(1)
    logits.requires_grad_()
    response_logprobs(logits, rows, positions, targets, 1.0, 64, False).sum().backward()
    touched = torch.zeros(logits.shape[:2], dtype=torch.bool)
    touched[positions, rows] = True
    assert logits.grad[~touched].abs().max() == 0
    assert (logits.grad[touched].abs().amax(dim=-1) > 0).all()


def test_detached_entropy_skips_its_gradient():
    """With the entropy only logged (detached), the gradient is that of the log-probs alone."""
    from dagrl.backends.logprob_kernel import response_logprobs

    logits, rows, positions, targets, _ = case(2)
    a = logits.clone().requires_grad_()
    lp, ent = response_logprobs(a, rows, positions, targets, 1.0, 64, True)
    (lp.sum() + ent.detach().sum()).backward()
    b = logits.clone().requires_grad_()
    response_logprobs(b, rows, positions, targets, 1.0, 64, False).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def _split_vocab(rank: int, world: int, seed: int):
    """Rank r holds columns [r*35, r*35 + 35) of 70 (64 real): the second has 29 real + padding."""
    from dagrl.backends.logprob_kernel import response_logprobs

    logits, rows, positions, targets, (g_lp, g_ent) = case(seed)
    shard = logits.shape[-1] // world
    mine = logits[..., rank * shard : (rank + 1) * shard].clone().requires_grad_()
    lp, ent = response_logprobs(
        mine, rows, positions, targets, 0.8, 64, True, group=torch.distributed.group.WORLD
    )
    (lp.double() * g_lp + ent.double() * g_ent).sum().backward()
    return lp.detach(), ent.detach(), mine.grad


def test_vocabulary_split_over_two_ranks_matches_one():
    (lp, ent, grad), _ = fused_and_reference(3, 0.8, True)
    ranks = run_distributed(_split_vocab, 2, 3)
    for rank_lp, rank_ent, _ in ranks:
        torch.testing.assert_close(rank_lp, lp, rtol=0, atol=1e-5)
        torch.testing.assert_close(rank_ent, ent, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat([r[2] for r in ranks], dim=-1), grad, rtol=0, atol=2e-5)


INTERPRETED = textwrap.dedent(
    """
    import torch
    from tests.backends.megatron.test_logprobs import fused_and_reference
    # 5000 columns: two blocks of the kernels' 4096, the second partly padding
    for temperature, entropy in ((1.0, True), (0.7, True), (0.7, False)):
        (lp, ent, grad), (ref_lp, ref_ent, ref_grad) = fused_and_reference(
            4, temperature, entropy, cols=5000, vocab=4990)
        torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=2e-5)
        if entropy:
            torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=2e-5)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=2e-5)
    print("ok")
    """
)


def test_triton_kernels_under_the_interpreter():
    """The kernels the GPU runs, executed by Triton's CPU interpreter (needs the triton package)."""
    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, TRITON_INTERPRET="1", DAGRL_LOGPROB_KERNEL="triton", PYTHONPATH=root)
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
