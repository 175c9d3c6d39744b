"""Token log-probs and entropy from vocab-parallel logits: each TP rank holds V/TP columns and
the full vocabulary is never gathered; only [B, T] statistics cross the TP group.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets) [B, T] from this rank's logits shard [B, T, V/TP] (fp32).

    megatron's fused cross-entropy overwrites its input with exp(logits) to save a copy of the
    shard, so the caller must not use `logits` afterwards (see `logprobs_and_entropy`).
    """
    # the kernel flattens every leading dim, so [B, T] works as well as its documented [T, B]
    return -vocab_parallel_cross_entropy(logits.contiguous(), targets.contiguous())


def vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy [B, T] of softmax(logits) over the full vocabulary, from the shard [B, T, V/TP].

    H = log Z - sum_v p_v * z_v with Z = sum_v exp(z_v). Differentiable: the sums cross the TP
    group through an all-reduce whose backward is the identity (the loss is replicated per rank).
    """
    group = mpu.get_tensor_model_parallel_group()
    shift = logits.detach().max(dim=-1).values
    if group.size() > 1:
        torch.distributed.all_reduce(shift, op=torch.distributed.ReduceOp.MAX, group=group)
    z = logits - shift.unsqueeze(-1)
    e = z.exp()
    norm = reduce_from_tensor_model_parallel_region(e.sum(dim=-1))
    weighted = reduce_from_tensor_model_parallel_region((e * z).sum(dim=-1))
    return norm.log() - weighted / norm


def mask_vocab_padding(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Push the logits of padding columns (ids >= vocab_size, on the last TP ranks) to -1e30 so
    they carry no probability. Finite, not -inf: entropy multiplies p by the logit (0 * -inf = nan)."""
    shard = logits.shape[-1]
    start = mpu.get_tensor_model_parallel_rank() * shard
    valid = max(0, min(shard, vocab_size - start))
    if valid == shard:
        return logits
    keep = torch.arange(shard, device=logits.device) < valid
    return logits.masked_fill(~keep, -1e30)


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, entropy: bool, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [B, T], entropy [B, T] or None) from logits [B, T, V/TP] this function owns."""
    if not entropy:
        return vocab_parallel_logprobs(logits, targets), None
    if entropy_grad:  # the entropy graph keeps `logits`: the in-place kernel gets a copy
        return vocab_parallel_logprobs(logits.clone(), targets), vocab_parallel_entropy(logits)
    with torch.no_grad():
        ent = vocab_parallel_entropy(logits)
    return vocab_parallel_logprobs(logits, targets), ent
