"""Chunked distillation quantities from a tiny Qwen2 built in code against the same math on the
model's full logits: values and gradients on every parameter."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from dagrl.algos.distillation import full_vocab_divergence, logprobs_at, topk_logprobs
from dagrl.backends.output_layer import output_layer
from dagrl.backends.torch.distill import (
    final_hidden,
    hidden_divergence,
    student_logprobs_at,
    teacher_topk,
)
from dagrl.core.batch import left_pad, sequence_inputs, teacher_sequence_inputs
from tests import tiny_models

VOCAB = 40


def tiny_qwen2(seed: int, tie: bool) -> Qwen2ForCausalLM:
    return tiny_models.tiny_qwen2(
        seed, VOCAB, hidden=16, heads=2, kv_heads=1, tie=tie, max_positions=32
    ).double()


@pytest.fixture
def batch():
    prompts, prompt_mask = left_pad([[3, 4, 5], [6, 7], [8, 9, 10, 11]], pad_id=0)
    responses = torch.tensor([[12, 13, 14, 0], [15, 16, 0, 0], [17, 18, 19, 20]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    teacher_prompts, teacher_mask = left_pad([[21, 3, 4, 5, 22], [6, 7], [23, 24, 8, 9, 10, 11, 25]], 0)
    return prompts, prompt_mask, responses, response_mask, teacher_prompts, teacher_mask


def student_side(model, prompts, prompt_mask, responses, response_mask):
    """Full response logits [B, R, V] (the reference) and (hidden [B*S, H], rows [N]) (ours)."""
    ids, attn, pos = sequence_inputs(prompts, prompt_mask, responses, response_mask)
    r = responses.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -r - 1 : -1]
    hidden = final_hidden(model, ids, attn, pos)
    b, c = response_mask.nonzero(as_tuple=True)
    rows = b * ids.shape[1] + (prompts.shape[1] - 1 + c)
    return logits, hidden.flatten(0, 1), rows


def param_grads(model):
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def assert_same_grads(a, b):
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-9, atol=1e-10, msg=name)


def test_final_hidden_through_the_output_layer_is_the_models_logits(batch):
    model = tiny_qwen2(0, tie=False)
    prompts, prompt_mask, responses, response_mask, *_ = batch
    ids, attn, pos = sequence_inputs(prompts, prompt_mask, responses, response_mask)
    weight, bias = output_layer(model)
    expected = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    torch.testing.assert_close(final_hidden(model, ids, attn, pos) @ weight.T, expected)
    assert bias is None


@pytest.mark.parametrize("tie", [True, False])
def test_student_logprobs_at_ids_match_full_logits_with_gradients(batch, tie):
    model = tiny_qwen2(1, tie)
    prompts, prompt_mask, responses, response_mask, *_ = batch
    mask = response_mask.bool()
    ids = torch.randint(0, VOCAB, (int(mask.sum()), 5), generator=torch.Generator().manual_seed(0))
    coef = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    logits, hidden, rows = student_side(model, prompts, prompt_mask, responses, response_mask)
    expected = logprobs_at(logits[mask], ids, temperature=0.7)
    (expected * coef).sum().backward()
    reference = param_grads(model)

    _, hidden, rows = student_side(model, prompts, prompt_mask, responses, response_mask)
    weight, bias = output_layer(model)
    ours = student_logprobs_at(hidden, rows, ids, weight, bias, temperature=0.7, chunk_tokens=3)
    (ours * coef).sum().backward()
    torch.testing.assert_close(ours, expected.detach())
    assert_same_grads(param_grads(model), reference)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_full_vocab_divergence_from_hidden_states_matches_full_logits_opsd(batch, beta):
    """Teacher with its own (longer) prompts: rows from the OPSD alignment."""
    student, teacher = tiny_qwen2(2, tie=True), tiny_qwen2(3, tie=False)
    prompts, prompt_mask, responses, response_mask, teacher_prompts, teacher_mask = batch
    t_in = teacher_sequence_inputs(teacher_prompts, teacher_mask, responses, response_mask)
    with torch.no_grad():
        t_logits = teacher(
            input_ids=t_in.input_ids, attention_mask=t_in.attention_mask, position_ids=t_in.position_ids
        ).logits
        t_grid = t_logits.gather(1, t_in.response_index[..., None].expand(-1, -1, VOCAB))
        t_hidden = final_hidden(teacher, t_in.input_ids, t_in.attention_mask, t_in.position_ids)
    t_b, t_c = t_in.token_coordinates(response_mask)
    t_rows = t_b * t_in.input_ids.shape[1] + t_c
    coef = torch.randn(
        int(response_mask.sum()), generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )

    logits, _, _ = student_side(student, prompts, prompt_mask, responses, response_mask)
    expected = full_vocab_divergence(logits.contiguous(), t_grid, response_mask, beta, 1.3)[
        response_mask.bool()
    ]
    (expected * coef).sum().backward()
    reference = param_grads(student)

    _, hidden, rows = student_side(student, prompts, prompt_mask, responses, response_mask)
    ours = hidden_divergence(
        hidden, rows, output_layer(student), t_hidden.flatten(0, 1), t_rows, output_layer(teacher),
        beta, 1.3, chunk_tokens=2,
    )  # fmt: skip
    (ours * coef).sum().backward()
    torch.testing.assert_close(ours, expected.detach())
    assert_same_grads(param_grads(student), reference)
    assert all(p.grad is None for p in teacher.parameters())


def test_teacher_topk_matches_full_logits(batch):
    model = tiny_qwen2(4, tie=True)
    prompts, prompt_mask, responses, response_mask, *_ = batch
    with torch.no_grad():
        logits, hidden, rows = student_side(model, prompts, prompt_mask, responses, response_mask)
    weight, bias = output_layer(model)
    ids, values = teacher_topk(hidden, rows, weight, k=6, bias=bias, temperature=0.9, chunk_tokens=4)
    ref_ids, ref_values = topk_logprobs(logits[response_mask.bool()], 6, temperature=0.9)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(values, ref_values)
    assert not values.requires_grad
