"""Distillation quantities from megatron's vocabulary-parallel logits [S, B, V/TP], never gathering
a [tokens, V] tensor on one rank.

Each tensor-parallel rank holds columns ``rank·V/TP ..`` of every token's logits (the last shard
may end in padding past the real vocabulary, which is ignored). What crosses the TP group is per
token, never per word:

- the log-normaliser: all-reduce MAX of the shard maxima, then all-reduce SUM of the rescaled
  sums of exponentials (``lse = M + log Σ_r Σ_v exp(z_v − M)``);
- teacher top-K (``vocab_parallel_topk``): each rank's own top-K, then an all-gather of the
  ``[N, K]`` values and global ids, and a top-K over the K·TP candidates — the K largest of the
  union are the K largest overall;
- the student's log-probs at given global ids (``vocab_parallel_logprobs_at``): the rank that holds
  an id contributes its logit, the others 0, summed over the group;
- the full-vocabulary generalized JSD (``vocab_parallel_divergence``): per-word terms summed over
  the shard, then summed over the group; ``vocab_parallel_hidden_divergence`` makes the teacher's
  shard of logits chunk by chunk from its final hidden states ``[N, H']`` and its output layer's
  rows of this shard, so no teacher logits exist beyond one chunk (full-vocabulary GKD);
- teacher top-K from final hidden states (``vocab_parallel_topk_from_hidden``): the same merge,
  each chunk's ``[tokens, V/TP]`` logits made from the hidden states and dropped after it.

Gradients: every all-reduce SUM here has an identity backward (``_SumOverGroup``). That is exact
when what it produces is used identically on every TP rank: each rank then already holds
d loss / d sum, which is d loss / d (its own partial sum). Where a replicated value (the student's
log-normaliser in the JSD) feeds per-shard partial terms instead, each rank only sees its shard's
part of that value's gradient, so it passes through ``_UseInShards`` (identity forward, all-reduce
backward) first — megatron's copy-to / reduce-from region pair. Each rank returns the gradient of
its own vocabulary columns, as megatron's output layer expects. The MAX is a shift that cancels
in the log-softmax: no gradient.
Work is chunked over tokens with recomputation (``map_token_chunks``), so at most one chunk of
fp32 ``[tokens, V/TP]`` lives at a time; every rank runs the same chunks, so the collectives in
them match up.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from dagrl.algos.distillation import chunk_tokens_for, generalized_jsd_terms, map_token_chunks, upcast


def _split(group: dist.ProcessGroup | None) -> bool:
    return group is not None and group.size() > 1


class _SumOverGroup(torch.autograd.Function):
    """All-reduce SUM forward, identity backward (see the module docstring for why that is exact)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _sum_over_group(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    return _SumOverGroup.apply(x, group) if _split(group) else x


class _UseInShards(torch.autograd.Function):
    """Identity forward, all-reduce SUM backward: a replicated tensor (the log-normaliser) feeding
    per-shard partial terms gets a partial gradient on each rank; its true gradient is their sum."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _use_in_shards(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    return _UseInShards.apply(x, group) if _split(group) else x


class _Shard:
    """Where this rank's columns sit in the vocabulary, and how its rows become fp32 logits / T."""

    def __init__(self, logits: Tensor, vocab_size: int, temperature: float, group: dist.ProcessGroup | None):
        width = logits.shape[-1]
        self.start = (dist.get_rank(group) if _split(group) else 0) * width
        self.valid = max(0, min(width, vocab_size - self.start))
        assert self.valid > 0, (
            f"a TP shard of {width} columns from {self.start} holds no real word of {vocab_size}"
        )
        self.inv_t = 1.0 / temperature
        self.group = group

    def scaled(self, rows: Tensor) -> Tensor:
        """[n, width] rows of this shard -> fp32 [n, valid] logits / T (padding columns dropped)."""
        return upcast(rows[:, : self.valid]) * self.inv_t

    def log_normaliser(self, z: Tensor) -> Tensor:
        """[n, valid] -> [n] log Σ_v exp z_v over the whole vocabulary (all ranks)."""
        top = z.detach().amax(dim=-1)
        if _split(self.group):
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.group)
        sums = torch.exp(z - top[:, None]).sum(-1)
        return top + _sum_over_group(sums, self.group).log()


def _flat(logits: Tensor, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """[S, B, W] logits as [S·B, W] (a view) and the flat row of each selected token."""
    return logits.view(-1, logits.shape[-1]), positions * logits.shape[1] + rows


@torch.no_grad()
def vocab_parallel_topk(
    logits: Tensor,
    rows: Tensor,
    positions: Tensor,
    k: int,
    temperature: float,
    vocab_size: int,
    group: dist.ProcessGroup | None = None,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The K most likely global ids per token and their log-probs at ``temperature`` (no grad).

    Args:
        logits: ``[S, B, V/TP]`` this rank's shard, any float dtype.
        rows, positions: ``[N]`` long: token n's logits are ``logits[positions[n], rows[n]]``.
        k: at most ``vocab_size``.
        vocab_size: the real vocabulary; shard columns past it are padding.
        group: the TP group the vocabulary is split over (None or size 1: not split).

    Returns:
        ids ``[N, K]`` long (global), log-probs ``[N, K]`` fp32, descending; equal on every rank.
    """
    assert 0 < k <= vocab_size, f"top-k {k} outside 1..vocabulary size {vocab_size}"
    shard = _Shard(logits, vocab_size, temperature, group)
    flat, src = _flat(logits, rows, positions)
    chunk = chunk_tokens or chunk_tokens_for(flat.shape[1])
    world = group.size() if _split(group) else 1
    ids, values = [], []
    for start in range(0, len(src), chunk):
        z = shard.scaled(flat[src[start : start + chunk]])
        lse = shard.log_normaliser(z)
        # A shard narrower than K offers all it has; -inf candidates never win the merge.
        local = z.topk(min(k, shard.valid), dim=-1)
        cand_values = torch.full((len(z), k), float("-inf"), dtype=z.dtype, device=z.device)
        cand_ids = torch.zeros((len(z), k), dtype=torch.long, device=z.device)
        cand_values[:, : local.values.shape[1]] = local.values
        cand_ids[:, : local.indices.shape[1]] = local.indices + shard.start
        if world > 1:
            gathered_values = [torch.empty_like(cand_values) for _ in range(world)]
            gathered_ids = [torch.empty_like(cand_ids) for _ in range(world)]
            dist.all_gather(gathered_values, cand_values, group=group)
            dist.all_gather(gathered_ids, cand_ids, group=group)
            cand_values, cand_ids = torch.cat(gathered_values, -1), torch.cat(gathered_ids, -1)
        best = cand_values.topk(k, dim=-1)
        ids.append(cand_ids.gather(-1, best.indices))
        values.append(best.values - lse[:, None])
    if not ids:
        return src.new_zeros(0, k), logits.new_zeros(0, k, dtype=torch.float32)
    return torch.cat(ids), torch.cat(values)


def vocab_parallel_logprobs_at(
    logits: Tensor,
    rows: Tensor,
    positions: Tensor,
    ids: Tensor,
    temperature: float,
    vocab_size: int,
    group: dist.ProcessGroup | None = None,
    chunk_tokens: int | None = None,
) -> Tensor:
    """Log-probs (over the whole vocabulary, at ``temperature``) of global ``ids``, with grad.

    Args:
        logits: ``[S, B, V/TP]`` this rank's shard (with grad).
        rows, positions: ``[N]`` as in ``vocab_parallel_topk``.
        ids: ``[N, K]`` long global ids (the teacher's top-K).

    Returns:
        ``[N, K]`` fp32, equal on every rank; the gradient reaches this rank's columns only.
    """
    shard = _Shard(logits, vocab_size, temperature, group)
    flat, src = _flat(logits, rows, positions)

    def logprobs(x: Tensor, token_ids: Tensor) -> Tensor:
        z = shard.scaled(x)
        local = token_ids - shard.start
        here = (local >= 0) & (local < shard.valid)
        picked = z.gather(-1, local.clamp(0, shard.valid - 1)) * here  # 0 from ranks without the id
        return _sum_over_group(picked, group) - shard.log_normaliser(z)[:, None]

    index = torch.arange(len(src), device=src.device)
    chunk = chunk_tokens or chunk_tokens_for(flat.shape[1])
    return map_token_chunks(logprobs, [(flat, src), (ids, index)], chunk_tokens=chunk)


def vocab_parallel_divergence(
    student_logits: Tensor,
    student_coords: tuple[Tensor, Tensor],
    teacher_logits: Tensor,
    teacher_coords: tuple[Tensor, Tensor],
    beta: float,
    temperature: float,
    vocab_size: int,
    group: dist.ProcessGroup | None = None,
    chunk_tokens: int | None = None,
) -> Tensor:
    """Exact full-vocabulary generalized JSD per token from two vocabulary-parallel logit shards.

    Args:
        student_logits: ``[S, B, V/TP]`` (with grad); student_coords (rows, positions) ``[N]`` each.
        teacher_logits: ``[S', B', V/TP]`` with the same TP split of the same vocabulary (no grad
            needed); teacher_coords pick the same N tokens there (OPSD: other positions).
        beta, temperature: see ``dagrl.algos.distillation``.

    Returns:
        ``[N]`` fp32, equal on every rank.
    """
    assert student_logits.shape[-1] == teacher_logits.shape[-1], "student and teacher shards differ in width"
    shard = _Shard(student_logits, vocab_size, temperature, group)
    s_flat, s_src = _flat(student_logits, *student_coords)
    t_flat, t_src = _flat(teacher_logits.detach(), *teacher_coords)

    def divergence(s_x: Tensor, t_x: Tensor) -> Tensor:
        return _shard_divergence(shard, s_x, t_x, beta)

    chunk = chunk_tokens or chunk_tokens_for(s_flat.shape[1])
    return map_token_chunks(divergence, [(s_flat, s_src), (t_flat, t_src)], chunk_tokens=chunk)


def _shard_divergence(shard: _Shard, s_x: Tensor, t_x: Tensor, beta: float) -> Tensor:
    """[n, W] student and teacher rows of this shard -> [n] generalized JSD over the whole vocabulary."""
    s_z, t_z = shard.scaled(s_x), shard.scaled(t_x)
    s_lp = s_z - _use_in_shards(shard.log_normaliser(s_z), shard.group)[:, None]
    t_lp = t_z - shard.log_normaliser(t_z)[:, None]
    return _sum_over_group(generalized_jsd_terms(s_lp, t_lp, beta).sum(-1), shard.group)


def _head_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    logits = hidden @ weight.T
    return logits if bias is None else logits + bias


def vocab_parallel_hidden_divergence(
    student_logits: Tensor,
    student_coords: tuple[Tensor, Tensor],
    teacher_hidden: Tensor,
    teacher_head: tuple[Tensor, Tensor | None],
    beta: float,
    temperature: float,
    vocab_size: int,
    group: dist.ProcessGroup | None = None,
    chunk_tokens: int | None = None,
) -> Tensor:
    """``vocab_parallel_divergence`` with the teacher's logits recomputed chunk by chunk.

    Args:
        student_logits: ``[S, B, V/TP]`` (with grad); student_coords (rows, positions) ``[N]`` each.
        teacher_hidden: ``[N, H']`` the teacher's final hidden states of the same N tokens (no grad).
        teacher_head: the teacher output layer's rows of this shard, weight ``[V/TP, H']`` (rows past
            the vocabulary are ignored) and bias ``[V/TP]`` or None.

    Returns:
        ``[N]`` fp32, equal on every rank.
    """
    weight, bias = teacher_head
    assert weight.shape[0] == student_logits.shape[-1], "teacher head rows != the student's shard width"
    weight, bias = weight.detach(), None if bias is None else bias.detach()
    shard = _Shard(student_logits, vocab_size, temperature, group)
    s_flat, s_src = _flat(student_logits, *student_coords)

    def divergence(s_x: Tensor, t_h: Tensor) -> Tensor:
        return _shard_divergence(shard, s_x, _head_logits(t_h, weight, bias), beta)

    index = torch.arange(len(s_src), device=s_src.device)
    chunk = chunk_tokens or chunk_tokens_for(s_flat.shape[1])
    return map_token_chunks(
        divergence, [(s_flat, s_src), (teacher_hidden.detach(), index)], chunk_tokens=chunk
    )


@torch.no_grad()
def vocab_parallel_topk_from_hidden(
    hidden: Tensor,
    head: tuple[Tensor, Tensor | None],
    k: int,
    temperature: float,
    vocab_size: int,
    group: dist.ProcessGroup | None = None,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``vocab_parallel_topk`` of the logits ``hidden @ weight.T (+ bias)``, made one chunk at a time.

    Args:
        hidden: ``[N, H]`` final hidden states of the N tokens.
        head: this shard's output-layer rows, weight ``[V/TP, H]``, bias ``[V/TP]`` or None.

    Returns:
        ids ``[N, K]`` long (global), log-probs ``[N, K]`` fp32, descending; equal on every rank.
    """
    weight, bias = head
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    ids, values = [], []
    for start in range(0, len(hidden), chunk):
        logits = _head_logits(hidden[start : start + chunk], weight, bias)[None]  # [1, n, V/TP]
        n = logits.shape[1]
        where = torch.arange(n, device=hidden.device)
        top = vocab_parallel_topk(
            logits, where, torch.zeros_like(where), k, temperature, vocab_size, group, n
        )
        ids.append(top[0])
        values.append(top[1])
    if not ids:
        return torch.zeros(0, k, dtype=torch.long, device=hidden.device), hidden.new_zeros(
            0, k, dtype=torch.float32
        )
    return torch.cat(ids), torch.cat(values)
