"""Distillation quantities from a HF causal LM, without a [B, T, V] fp32 tensor for the micro-batch.

A HF forward returns logits for every position: at a 151,936-word vocabulary and 4k response
tokens that is 1.2 GB in bf16, and the fp32 log-softmax a loss takes of it 2.5 GB more per copy.
Here the model runs up to its final hidden states ``[B, S, H]`` (H ~ 1-4k), and the output layer
is applied chunk by chunk of response tokens, inside the loss (``map_token_chunks``: the backward
recomputes each chunk), so at most one chunk of ``[tokens, V]`` logits exists at a time, for the
student and for a teacher running in the same process alike:

- ``student_logprobs_at``: the student's log-probs at given ids (the teacher's top-K), with grad;
- ``hidden_divergence``: the exact full-vocabulary generalized JSD, with grad;
- ``teacher_topk``: the teacher's top-K ids and log-probs at a temperature, no grad;
- ``grid_logprobs_at``: log-probs at given ids from logits the forward already made (``[B, R, V]``);

The output layer these read (a frozen teacher's alone, from its checkpoint) comes from
dagrl/backends/output_layer.py, shared with the megatron backend.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dagrl.algos.distillation import chunk_tokens_for, divergence_from_logits, map_token_chunks, upcast


def final_hidden(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor
) -> Tensor:
    """``[B, S, H]`` hidden states after the final norm: what the output layer maps to logits."""
    if hasattr(model, "get_base_model"):  # a PEFT model (LoRA): its adapters sit inside the HF model
        model = model.get_base_model()
    out = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    return out.last_hidden_state


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    return upcast(logits) / temperature


def student_logprobs_at(
    hidden: Tensor,
    rows: Tensor,
    ids: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> Tensor:
    """Log-probs (normalised over the whole vocabulary, at ``temperature``) of ``ids``, with grad.

    Args:
        hidden: ``[M, H]`` final hidden states (e.g. ``final_hidden(...).flatten(0, 1)``).
        rows: ``[N]`` long: token n's hidden state is ``hidden[rows[n]]``.
        ids: ``[N, K]`` long token ids (the teacher's top-K).
        weight, bias: the output layer (``output_layer``).

    Returns:
        ``[N, K]`` fp32; gradients reach ``hidden``, ``weight`` and ``bias``.
    """

    def logprobs(h: Tensor, token_ids: Tensor, w: Tensor, *b: Tensor) -> Tensor:
        return torch.log_softmax(_logits(h, w, b[0] if b else None, temperature), dim=-1).gather(
            -1, token_ids
        )

    shared = [weight] if bias is None else [weight, bias]
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    return map_token_chunks(
        logprobs, [(hidden, rows), (ids, torch.arange(len(rows), device=rows.device))], shared, chunk
    )


def hidden_divergence(
    student_hidden: Tensor,
    student_rows: Tensor,
    student_head: tuple[Tensor, Tensor | None],
    teacher_hidden: Tensor,
    teacher_rows: Tensor,
    teacher_head: tuple[Tensor, Tensor | None],
    beta: float,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> Tensor:
    """Exact full-vocabulary generalized JSD per token, both models' logits made chunk by chunk.

    Args:
        student_hidden: ``[M, H]`` student final hidden states (with grad).
        student_rows: ``[N]`` the rows of the N response tokens in ``student_hidden``.
        student_head: the student's output layer (weight ``[V, H]``, bias).
        teacher_hidden: ``[M', H']`` the teacher's (no grad needed); in OPSD its prompt differs,
            so ``teacher_rows`` differ from ``student_rows`` (``TeacherInputs.token_coordinates``).
        teacher_head: the teacher's output layer, weight ``[V, H']``: the same vocabulary.
        beta, temperature: see ``dagrl.algos.distillation``.

    Returns:
        ``[N]`` fp32.
    """
    (s_w, s_b), (t_w, t_b) = student_head, teacher_head
    assert s_w.shape[0] == t_w.shape[0], (
        f"vocabularies differ: student {s_w.shape[0]}, teacher {t_w.shape[0]}"
    )
    t_w, t_b = t_w.detach(), None if t_b is None else t_b.detach()

    def divergence(s_h: Tensor, t_h: Tensor, w: Tensor, *b: Tensor) -> Tensor:
        teacher = _logits(t_h, t_w, t_b, 1.0)
        return divergence_from_logits(_logits(s_h, w, b[0] if b else None, 1.0), teacher, beta, temperature)

    shared = [s_w] if s_b is None else [s_w, s_b]
    chunk = chunk_tokens or chunk_tokens_for(s_w.shape[0])
    rows = [(student_hidden, student_rows), (teacher_hidden.detach(), teacher_rows)]
    return map_token_chunks(divergence, rows, shared, chunk)


@torch.no_grad()
def teacher_topk(
    hidden: Tensor,
    rows: Tensor,
    weight: Tensor,
    k: int,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The teacher's K most likely ids per token and their log-probs over the whole vocabulary at
    ``temperature``, chunk by chunk of tokens.

    Args:
        hidden: ``[M, H]`` teacher final hidden states; rows ``[N]`` pick the response tokens.
        weight, bias: the teacher's output layer.

    Returns:
        ids ``[N, K]`` long, log-probs ``[N, K]`` fp32, in descending order.
    """
    assert 0 < k <= weight.shape[0], f"top-k {k} outside 1..vocabulary size {weight.shape[0]}"
    ids, values = [], []
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    for start in range(0, len(rows), chunk):
        logprobs = torch.log_softmax(
            _logits(hidden[rows[start : start + chunk]], weight, bias, temperature), -1
        )
        top = logprobs.topk(k, dim=-1)
        ids.append(top.indices)
        values.append(top.values)
    if not ids:
        return rows.new_zeros(0, k), hidden.new_zeros(0, k, dtype=torch.float32)
    return torch.cat(ids), torch.cat(values)


def grid_logprobs_at(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / T)`` at ``ids``, chunk by chunk of tokens, with grad.

    Args:
        logits: ``[B, R, V]`` any float dtype (the response positions of a forward's logits).
        ids: ``[B, R, K]`` long.

    Returns:
        ``[B, R, K]`` fp32; no fp32 ``[B, R, V]`` copy is kept for the backward.
    """
    b, r, v = logits.shape
    k = ids.shape[-1]
    rows = torch.arange(b * r, device=logits.device)

    def logprobs(chunk: Tensor, chunk_ids: Tensor) -> Tensor:
        return torch.log_softmax(upcast(chunk) / temperature, dim=-1).gather(-1, chunk_ids)

    flat = [(logits.reshape(b * r, v), rows), (ids.reshape(b * r, k), rows)]
    return map_token_chunks(logprobs, flat, chunk_tokens=chunk_tokens_for(v)).view(b, r, k)
