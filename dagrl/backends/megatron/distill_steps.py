"""The megatron backend's distillation steps: the teacher's forward and the student's GKD quantities.

Teacher (a forward-only MegatronTrainBackend with its own model, the student's TP/PP layout): the
last pipeline stage's output layer is bypassed (``hidden_instead_of_logits``), so a forward ends
at the final hidden states ``[S, B, H']`` and no micro-batch ever makes logits for its prompt
positions. From the N response positions' hidden states ``[N, H']``:
- top-k: each chunk of tokens' ``[n, V/TP]`` logits is made with this rank's output-layer rows,
  top-K'd per shard and merged over the K·TP candidates (``vocab_parallel_topk_from_hidden``);
- full vocabulary: the hidden states themselves are the output (teacher_hidden ``[B, R, H']``).

Student (the last stage's loss function, inside megatron's forward-backward schedule): log-probs
at the teacher's top-K ids (``vocab_parallel_logprobs_at``), or the exact full-vocabulary JSD with
the teacher's logits recomputed chunk by chunk from teacher_hidden and the teacher's output layer
(``vocab_parallel_hidden_divergence``); vocabulary-parallel throughout, nothing [tokens, V] is
gathered on one rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import torch
from megatron.core import parallel_state as mpu
from torch import Tensor

from dagrl.backends.megatron.distillation import (
    vocab_parallel_hidden_divergence,
    vocab_parallel_logprobs_at,
    vocab_parallel_topk_from_hidden,
)
from dagrl.backends.output_layer import load_output_layer
from dagrl.objectives import TokenRequest


def _hidden_output(input_, weight=None, runtime_gather_output=None, *, sequence_parallel: bool, **kwargs):
    """An output layer's forward that returns its input, gathered over the sequence-parallel
    split (what ColumnParallelLinear does before its matmul); no bias: ``(hidden, None)``."""
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    if sequence_parallel and mpu.get_tensor_model_parallel_world_size() > 1:
        input_ = gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=False)
    return input_, None


@contextlib.contextmanager
def hidden_instead_of_logits(chunks: list, sequence_parallel: bool) -> Iterator[None]:
    """Within: the model chunks' forward returns the final hidden states ``[S, B, H]`` (after the
    final norm) where it would return vocabulary-parallel logits."""
    layers = [chunk.output_layer for chunk in chunks if getattr(chunk, "post_process", False)]
    for layer in layers:
        # an instance attribute: nn.Module.__call__ finds it before the class's forward
        layer.forward = partial(_hidden_output, sequence_parallel=sequence_parallel)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def output_head(chunks: list) -> tuple[Tensor, Tensor | None]:
    """This rank's rows of the output layer (weight ``[V/TP, H]``, bias or None), last stage only."""
    chunk = next(c for c in chunks if getattr(c, "post_process", False))
    if chunk.share_embeddings_and_output_weights:
        return chunk.shared_embedding_or_output_weight(), None
    return chunk.output_layer.weight, chunk.output_layer.bias


def response_rows(mi, hidden: Tensor) -> Tensor:
    """``[S, B, H]`` -> ``[N, H]``: the hidden states predicting the micro-batch's N response tokens."""
    return hidden.reshape(-1, hidden.shape[-1])[mi.token_positions * hidden.shape[1] + mi.token_rows]


def to_response_grid(mi, values: Tensor) -> Tensor:
    """``[N, ...]`` -> ``[B, R, ...]``, zeros at response cells outside the sequence (padding)."""
    rows, resp_len = mi.response_shape
    grid = values.new_zeros(rows * resp_len, *values.shape[1:]).index_copy(0, mi.token_index, values)
    return grid.view(rows, resp_len, *values.shape[1:])


def teacher_topk_step(head, k: int, temperature: float, vocab_size: int, mi, hidden: Tensor) -> dict:
    """One teacher micro-batch's top-K ids and log-probs ``[B, R, K]`` from its hidden states ``[S, B, H]``."""
    group = mpu.get_tensor_model_parallel_group()
    ids, logprobs = vocab_parallel_topk_from_hidden(
        response_rows(mi, hidden), head, k, temperature, vocab_size, group
    )
    return {
        "teacher_topk_ids": to_response_grid(mi, ids),
        "teacher_topk_logprobs": to_response_grid(mi, logprobs),
    }


def teacher_hidden_step(mi, hidden: Tensor) -> dict:
    """One teacher micro-batch's hidden states on the response grid ``[B, R, H]``."""
    return {"teacher_hidden": to_response_grid(mi, response_rows(mi, hidden))}


def teacher_head_shard(
    path: str, trust_remote_code: bool, width: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor | None]:
    """The teacher's output layer rows of this TP rank's vocabulary shard (``width`` columns),
    read from its HF checkpoint; rows past its vocabulary are zero (they are ignored as padding)."""
    weight, bias = load_output_layer(path, trust_remote_code)
    start = mpu.get_tensor_model_parallel_rank() * width

    def rows(t: Tensor) -> Tensor:
        out = t.new_zeros(width, *t.shape[1:])
        part = t[start : start + width]
        out[: len(part)] = part
        return out.to(device, dtype)

    return rows(weight), None if bias is None else rows(bias)


def student_distill_outputs(
    mi, logits: Tensor, request: TokenRequest, vocab_size: int, teacher_head
) -> dict[str, Tensor]:
    """The request's distillation quantities on the response grid from the student's logits
    ``[S, B, V/TP]``: ``logprobs_at`` ``[B, R, K]`` and/or ``divergence`` ``[B, R]``.

    ``teacher_head``: ``dtype -> (weight, bias)``, the teacher's output-layer shard (full vocab)."""
    group = mpu.get_tensor_model_parallel_group()
    coords = (mi.token_rows, mi.token_positions)
    out = {}
    if request.logprobs_at is not None:
        ids = mi.batch[request.logprobs_at]
        ids = ids.reshape(-1, ids.shape[-1])[mi.token_index]  # [N, K]
        at = vocab_parallel_logprobs_at(
            logits, *coords, ids, request.logprobs_at_temperature, vocab_size, group
        )
        out["logprobs_at"] = to_response_grid(mi, at)
    full = request.full_vocab
    if full is not None:
        hidden = mi.batch[full.hidden_key]
        hidden = hidden.reshape(-1, hidden.shape[-1])[mi.token_index]  # [N, H']
        divergence = vocab_parallel_hidden_divergence(
            logits, coords, hidden, teacher_head(hidden.dtype), full.beta, full.temperature, vocab_size, group
        )
        out["divergence"] = to_response_grid(mi, divergence)
    return out
