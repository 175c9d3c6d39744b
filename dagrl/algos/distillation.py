"""Distillation losses: pure tensor functions shared by every backend.

- Generalized JSD between the student's and the teacher's next-token distributions, per response
  token (GKD: Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
  Self-Generated Mistakes", ICLR 2024, §3 and eq. 1), with ms-swift's and TRL's conventions for
  ``beta``: 0 = forward KL(teacher‖student), 1 = reverse KL(student‖teacher), in between = the
  generalized JSD with the mixture ``m = beta·p_t + (1 − beta)·p_s``:
  ``JSD_beta = beta·KL(p_t‖m) + (1 − beta)·KL(p_s‖m)``. Both models' logits are divided by the
  same ``temperature`` first.
  - over the full vocabulary, exactly, chunked over tokens (``full_vocab_divergence``), so a
    151,936-word vocabulary never needs more than one chunk of fp32 ``[tokens, V]`` at once;
  - over the teacher's top-K support (``topk_divergence``): both distributions renormalised over
    those K ids (ms-swift's ``gkd_logits_topk``), or with the mass outside them kept as one extra
    bucket (``tail_bucket=True``), so a student that puts mass off the teacher's support pays for it.
- On-policy reverse KL as a reward (``reverse_kl_advantages``): Thinking Machines, "On-Policy
  Distillation" (Lu et al. 2025), as slime implements it.

Left out, on purpose: Hinton's ``T²`` factor on the loss (neither TRL nor ms-swift applies it; the
temperature is a sampling temperature here, usually 1), and sequence-level KD on teacher-generated
responses (``seq_kd``): it needs teacher generation, which the colocated forward-only teacher
does not do.

Shapes: ``B`` responses, ``T`` response length (padded), ``V`` vocabulary, ``K`` top-k, ``N`` the
tokens a chunked function works on. Masks are 0/1 ``[B, T]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

# Tokens per chunk so that one fp32 [chunk, V] tensor is 64 MiB; the divergence keeps about ten
# of them alive in the backward pass (log-probs, probabilities, mixture, their gradients).
_CHUNK_ELEMENTS = 16 * 2**20
# Smallest tail mass: a top-K support that covers (numerically) everything leaves log(0) = -inf.
_MIN_TAIL_LOG = -69.0  # ~ log(1e-30)


def upcast(x: Tensor) -> Tensor:
    """fp32 for half-precision inputs; fp32 and fp64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def chunk_tokens_for(vocab_size: int) -> int:
    """Tokens per chunk for a ``vocab_size``-wide fp32 working set (see ``_CHUNK_ELEMENTS``)."""
    return max(1, _CHUNK_ELEMENTS // vocab_size)


# ---- divergences over normalised log-distributions ----------------------------------------------
def _kl_terms(p_log: Tensor, q_log: Tensor) -> Tensor:
    """Elementwise ``p·(log p − log q)``, 0 where ``p = 0`` (so -inf log-probs give 0, not nan)."""
    present = p_log > float("-inf")
    p_log_safe = torch.where(present, p_log, 0.0)  # keeps nan out of the backward of the masked branch
    return torch.where(present, p_log_safe.exp() * (p_log_safe - q_log), 0.0)


def generalized_jsd_terms(student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float) -> Tensor:
    """Per-word contributions to the generalized JSD; summing the last dim gives the divergence.

    Split out so that a vocabulary-parallel caller sums its shard and all-reduces the partial sums.

    Args:
        student_logprobs, teacher_logprobs: ``[..., V]`` log-probabilities (normalised over V).
        beta: in [0, 1]; 0 = KL(teacher‖student), 1 = KL(student‖teacher), else
            ``beta·KL(p_t‖m) + (1 − beta)·KL(p_s‖m)`` with ``m = beta·p_t + (1 − beta)·p_s``.

    Returns:
        ``[..., V]``, fp32 when the inputs are.
    """
    assert 0.0 <= beta <= 1.0, f"beta must be in [0, 1], got {beta}"
    if beta == 0.0:
        return _kl_terms(teacher_logprobs, student_logprobs)
    if beta == 1.0:
        return _kl_terms(student_logprobs, teacher_logprobs)
    mixture = torch.logaddexp(teacher_logprobs + math.log(beta), student_logprobs + math.log(1.0 - beta))
    return beta * _kl_terms(teacher_logprobs, mixture) + (1.0 - beta) * _kl_terms(student_logprobs, mixture)


def generalized_jsd(student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float) -> Tensor:
    """Generalized JSD (GKD, Agarwal et al. 2024) between two log-distributions over the last dim.

    Args:
        student_logprobs, teacher_logprobs: ``[..., V]`` normalised log-probabilities.
        beta: see ``generalized_jsd_terms``.

    Returns:
        ``[...]`` in nats; 0 iff the distributions are equal (for ``0 < beta < 1`` it is at most
        the entropy of the Bernoulli(beta), ``JSD_0.5 <= log 2``).
    """
    return generalized_jsd_terms(student_logprobs, teacher_logprobs, beta).sum(-1)


def divergence_from_logits(
    student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float
) -> Tensor:
    """Generalized JSD of ``softmax(student / T)`` and ``softmax(teacher / T)``, in fp32, unchunked.

    The reference the chunked and vocabulary-parallel versions are tested against.

    Args:
        student_logits, teacher_logits: ``[..., V]`` any float dtype.

    Returns:
        ``[...]`` fp32.
    """
    student = torch.log_softmax(upcast(student_logits) / temperature, dim=-1)
    teacher = torch.log_softmax(upcast(teacher_logits) / temperature, dim=-1)
    return generalized_jsd(student, teacher, beta)


# ---- chunking over tokens with recomputation -----------------------------------------------------
def map_token_chunks(
    fn: Callable[..., Tensor],
    row_inputs: Sequence[tuple[Tensor, Tensor]],
    shared: Sequence[Tensor] = (),
    chunk_tokens: int = 1024,
) -> Tensor:
    """``fn(*(x[rows] for x, rows in row_inputs), *shared)`` evaluated ``chunk_tokens`` rows at a time.

    The forward runs without a graph; the backward recomputes each chunk with one, so only one
    chunk's intermediates (e.g. fp32 ``[chunk, V]`` log-softmaxes) are ever alive, and the
    gradient is exactly that of the unchunked ``fn`` (``fn`` must be deterministic and act on rows
    independently). Gradients flow to every input that requires one: row inputs through
    ``index_add`` (rows may repeat), shared inputs (e.g. an output-layer weight) summed over chunks.
    Collectives inside ``fn`` are fine as long as every rank runs the same chunks.

    Args:
        fn: maps ``[n, ...]`` row slices (plus the shared tensors) to ``[n, ...]``.
        row_inputs: pairs (tensor ``[M_i, ...]``, long ``rows_i`` ``[N]``): chunk c reads
            ``tensor[rows_i[c]]``; every ``rows_i`` has the same length N.
        shared: tensors passed whole to every call.

    Returns:
        ``[N, ...]``, the rows of ``fn``'s outputs concatenated.
    """
    lengths = {len(rows) for _, rows in row_inputs}
    assert len(lengths) == 1, f"row index lengths differ: {lengths}"
    flat: list[Tensor] = []
    for tensor, rows in row_inputs:
        flat += [rows, tensor]
    return _TokenChunks.apply(fn, max(1, chunk_tokens), len(row_inputs), *flat, *shared)


class _TokenChunks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, chunk, n_rows, *tensors):
        rows = tensors[0 : 2 * n_rows : 2]
        row_tensors, shared = tensors[1 : 2 * n_rows : 2], tensors[2 * n_rows :]
        outs = []
        for start in range(0, len(rows[0]), chunk):
            pieces = [x[r[start : start + chunk]] for x, r in zip(row_tensors, rows)]
            outs.append(fn(*pieces, *shared))
        ctx.fn, ctx.chunk, ctx.n_rows = fn, chunk, n_rows
        ctx.save_for_backward(*tensors)
        if not outs:  # no rows: an empty output of fn's trailing shape is unknowable; [0] is enough
            return row_tensors[0].new_zeros(0, dtype=torch.promote_types(row_tensors[0].dtype, torch.float32))
        return torch.cat(outs)

    @staticmethod
    def backward(ctx, grad_out):
        tensors = ctx.saved_tensors
        n_rows = ctx.n_rows
        needs = ctx.needs_input_grad[3:]
        rows = tensors[0 : 2 * n_rows : 2]
        row_tensors, shared = tensors[1 : 2 * n_rows : 2], tensors[2 * n_rows :]
        row_needs, shared_needs = needs[1 : 2 * n_rows : 2], needs[2 * n_rows :]
        row_grads = [torch.zeros_like(x) if need else None for x, need in zip(row_tensors, row_needs)]
        shared_grads = [torch.zeros_like(s) if need else None for s, need in zip(shared, shared_needs)]
        for start in range(0, len(rows[0]), ctx.chunk):
            index = [r[start : start + ctx.chunk] for r in rows]
            with torch.enable_grad():
                pieces = [x[i].detach().requires_grad_(n) for x, i, n in zip(row_tensors, index, row_needs)]
                whole = [s.detach().requires_grad_(n) for s, n in zip(shared, shared_needs)]
                out = ctx.fn(*pieces, *whole)
                wrt = [t for t in (*pieces, *whole) if t.requires_grad]
                grads = iter(torch.autograd.grad(out, wrt, grad_out[start : start + ctx.chunk]))
            for k, need in enumerate(row_needs):
                if need:
                    row_grads[k].index_add_(0, index[k], next(grads).to(row_grads[k].dtype))
            for k, need in enumerate(shared_needs):
                if need:
                    shared_grads[k] += next(grads)
        interleaved = [g for pair in zip([None] * n_rows, row_grads) for g in pair]
        return (None, None, None, *interleaved, *shared_grads)


# ---- per-token losses on the response grid --------------------------------------------------------
def full_vocab_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    response_mask: Tensor,
    beta: float,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> Tensor:
    """Per-token generalized JSD over the whole vocabulary, exact, chunked over the masked tokens.

    Only the masked tokens are computed, ``chunk_tokens`` at a time (see ``map_token_chunks``):
    no fp32 ``[B, T, V]`` copy is made; the gradient with respect to ``student_logits`` is one
    tensor of their shape and dtype. Pass contiguous logits (``reshape`` of a strided view copies).

    Args:
        student_logits: ``[B, T, V]`` (any float dtype, with grad).
        teacher_logits: ``[B, T, V]`` on the same response grid (no grad needed).
        response_mask: ``[B, T]`` 0/1.
        beta, temperature: see the module docstring.
        chunk_tokens: tokens per chunk; default ``chunk_tokens_for(V)``.

    Returns:
        ``[B, T]`` fp32, 0 where masked; reduce it with ``losses.agg_loss``.
    """
    assert student_logits.shape == teacher_logits.shape, (student_logits.shape, teacher_logits.shape)
    vocab = student_logits.shape[-1]
    rows = response_mask.reshape(-1).nonzero().squeeze(-1)

    def divergence(student: Tensor, teacher: Tensor) -> Tensor:
        return divergence_from_logits(student, teacher, beta, temperature)

    per_token = map_token_chunks(
        divergence,
        [(student_logits.reshape(-1, vocab), rows), (teacher_logits.reshape(-1, vocab), rows)],
        chunk_tokens=chunk_tokens or chunk_tokens_for(vocab),
    )
    out = per_token.new_zeros(response_mask.numel())
    return out.index_put((rows,), per_token).view(response_mask.shape)


def log1mexp(x: Tensor) -> Tensor:
    """``log(1 − exp(x))`` for ``x <= 0``, accurate at both ends (Mächler 2012), clamped so that
    ``x -> 0`` (nothing left) gives ``_MIN_TAIL_LOG`` instead of -inf."""
    x = x.clamp(max=-1e-30)
    out = torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))
    return out.clamp(min=_MIN_TAIL_LOG)


def topk_divergence(
    student_logprobs: Tensor,
    teacher_topk_logprobs: Tensor,
    response_mask: Tensor,
    beta: float,
    tail_bucket: bool = False,
) -> Tensor:
    """Per-token generalized JSD on the teacher's top-K support.

    Both inputs are log-probabilities over the full vocabulary at the sampling temperature, taken
    at the teacher's top-K ids (see ``topk_logprobs`` and ``logprobs_at``).

    - ``tail_bucket=False`` (ms-swift's ``gkd_logits_topk``): both are renormalised over the K ids
      (a log-softmax over K), so mass outside the support is ignored.
    - ``tail_bucket=True``: a (K+1)-th outcome "any other word" holds ``1 − sum of the K
      probabilities`` for each model, so the divergence is that of two distributions over
      K + 1 outcomes that sum to 1, and ``K = V`` gives the full-vocabulary divergence.

    Args:
        student_logprobs: ``[B, T, K]`` student log-probs at the teacher's top-K ids (with grad).
        teacher_topk_logprobs: ``[B, T, K]``.
        response_mask: ``[B, T]`` 0/1.
        beta: see the module docstring.

    Returns:
        ``[B, T]`` fp32, 0 where masked.
    """
    student = upcast(student_logprobs)
    teacher = upcast(teacher_topk_logprobs)
    if tail_bucket:
        student = torch.cat([student, log1mexp(torch.logsumexp(student, -1, keepdim=True))], dim=-1)
        teacher = torch.cat([teacher, log1mexp(torch.logsumexp(teacher, -1, keepdim=True))], dim=-1)
    else:
        student = torch.log_softmax(student, dim=-1)
        teacher = torch.log_softmax(teacher, dim=-1)
    return generalized_jsd(student, teacher, beta) * response_mask.to(student.dtype)


def logprobs_at(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / T)`` at ``ids``: ``[..., V]``, ``[..., K]`` -> ``[..., K]`` fp32.

    The unchunked reference; backends compute it in chunks or vocabulary-parallel."""
    return torch.log_softmax(upcast(logits) / temperature, dim=-1).gather(-1, ids)


def topk_logprobs(logits: Tensor, k: int, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """The K most likely ids of ``softmax(logits / T)`` and their log-probs (over all V), descending.

    Args:
        logits: ``[..., V]``.

    Returns:
        ids ``[..., K]`` long, log-probs ``[..., K]`` fp32.
    """
    logprobs = torch.log_softmax(upcast(logits) / temperature, dim=-1)
    values, ids = logprobs.topk(k, dim=-1)
    return ids, values


# ---- on-policy reverse KL as a reward ----------------------------------------------------------------
@torch.no_grad()
def reverse_kl_advantages(
    student_logprobs: Tensor, teacher_logprobs: Tensor, response_mask: Tensor, coef: float = 1.0
) -> Tensor:
    """Per-token advantage ``−coef·(log π_s(y_t) − log π_t(y_t))`` of the sampled tokens.

    On-policy distillation as Thinking Machines' "On-Policy Distillation" (Lu et al. 2025) and
    slime do it: the per-token reverse KL is a (negative) reward, fed to the policy-gradient loss
    as an advantage, with no discounting to later tokens, and may be added to GRPO's advantages
    (``compute_grpo_advantages(...) + reverse_kl_advantages(...)``).

    Why a reward, under stop-gradient, and not a loss: the reverse KL is
    ``KL(π_s‖π_t) = E_{y~π_s}[log π_s(y) − log π_t(y)]``, an expectation under the model being
    trained. Backpropagating the sampled estimate ``k1 = log π_s(y) − log π_t(y)`` as a loss,
    with y held fixed, gives ``∇ log π_s(y)``, whose expectation is
    ``E_{y~π_s}[∇ log π_s(y)] = Σ_y ∇π_s(y) = ∇ Σ_y π_s(y) = ∇1 = 0``: pure noise, and blind to
    π_t. The true gradient, ``E_{y~π_s}[(log π_s(y) − log π_t(y))·∇ log π_s(y)]``, is the score
    function weighted by k1 — exactly a policy gradient with reward −k1 held constant.

    Args:
        student_logprobs: ``[B, T]`` log-probs of the sampled tokens under the policy that sampled
            them (``old_logprobs`` or ``rollout_logprobs``).
        teacher_logprobs: ``[B, T]`` the teacher's log-probs of the same tokens.
        response_mask: ``[B, T]`` 0/1.
        coef: weight of the term (slime's ``kl_coef`` for it).

    Returns:
        ``[B, T]`` fp32, detached, 0 where masked.
    """
    k1 = upcast(student_logprobs) - upcast(teacher_logprobs)
    return -coef * k1 * response_mask.to(k1.dtype)
