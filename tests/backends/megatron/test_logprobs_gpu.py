"""The Triton log-prob / entropy kernels on a GPU, at a real vocabulary (151936 columns, bf16),
against the torch passes and float64 math. Run on the GPU machine:

    python -m pytest -m gpu tests/backends/megatron/test_logprobs_gpu.py
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.backends.megatron.test_logprobs import reference

pytestmark = pytest.mark.gpu
pytest.importorskip("megatron.core")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)


def run(kernel: str, logits, rows, positions, targets, grads, temperature, vocab):
    from dagrl.backends.logprob_kernel import response_logprobs

    os.environ["DAGRL_LOGPROB_KERNEL"] = kernel
    try:
        x = logits.clone().requires_grad_()
        lp, ent = response_logprobs(x, rows, positions, targets, temperature, vocab, True)
        (lp * grads[0] + ent * grads[1]).sum().backward()
        return lp.detach(), ent.detach(), x.grad
    finally:
        del os.environ["DAGRL_LOGPROB_KERNEL"]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_triton_matches_torch_passes_and_float64(temperature):
    g = torch.Generator(device="cuda").manual_seed(0)
    seq, rows_n, cols, vocab, tokens = 160, 16, 151936, 151900, 2048
    logits = (torch.randn(seq, rows_n, cols, device="cuda", generator=g) * 3).to(torch.bfloat16)
    picked = torch.randperm(seq * rows_n, device="cuda", generator=g)[:tokens]
    rows, positions = picked % rows_n, picked // rows_n
    targets = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    grads = torch.randn(2, tokens, device="cuda", generator=g)
    fast = run("triton", logits, rows, positions, targets, grads, temperature, vocab)
    slow = run("torch", logits, rows, positions, targets, grads, temperature, vocab)
    for a, b in zip(fast[:2], slow[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    # the gradients are written in bf16: compare at bf16 resolution, every element written
    torch.testing.assert_close(fast[2].float(), slow[2].float(), rtol=1e-2, atol=1e-6)
    assert fast[2][positions, rows, vocab:].abs().max() == 0
    # float64 on a few tokens
    ref_lp, ref_ent = reference(logits, rows[:64], positions[:64], targets[:64], temperature, vocab)
    torch.testing.assert_close(fast[0][:64].double(), ref_lp, rtol=0, atol=1e-4)
    torch.testing.assert_close(fast[1][:64].double(), ref_ent, rtol=0, atol=1e-4)
