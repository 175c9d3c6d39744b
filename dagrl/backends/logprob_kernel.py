"""Token log-probs and entropy of the response tokens, straight from (vocab-parallel) logits
[S, B, V/TP] in the model's dtype: megatron's output layer, or the torch backend's on CUDA (TP = 1).
Plain torch and Triton, no megatron: both train backends import it.

One autograd function does what a chain of torch ops did before (gather the response positions,
upcast to fp32, divide by the temperature, max, exp, sum, cross-entropy, entropy), each of which
read and wrote a fp32 [tokens, V] tensor: the forward reads every selected logit row once and
keeps per-token statistics (running max, sum of exponentials, sum of p * z), the backward reads
it once more and writes the gradient in the logits' dtype. Nothing of size [tokens, V] is
allocated besides that gradient. On CUDA two Triton kernels do the passes; elsewhere (CPU tests)
the same math runs in torch over chunks of tokens. Only [N] statistics cross the TP group.

For token n with logits z = x / T over the full vocabulary (x this row of logits, T the sampling
temperature): lse = log sum_v exp z_v; log p(y) = z_y - lse; H = lse - sum_v p_v z_v.
Gradients: d log p(y) / dz = onehot(y) - p; dH / dz = -p * (log p + H).
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.distributed as dist

from dagrl.errors import DagrlError

NEG = -1e30  # the logit of vocabulary padding: finite, so p * z is 0 * NEG = 0, not nan
_CHUNK_BYTES = 256 * 2**20  # fp32 working set of the torch path per chunk of tokens

try:  # ships with CUDA builds of torch; absent on the CPU build
    import triton
    import triton.language as tl
except ImportError:
    triton = None


LOGPROB_KERNEL_ENV = "DAGRL_LOGPROB_KERNEL"


def logprob_kernel_override() -> str | None:
    """`DAGRL_LOGPROB_KERNEL` (torch | triton) forcing the log-prob implementation, or None for the
    default (Triton on CUDA, torch passes elsewhere); any other value is an error."""
    value = os.environ.get(LOGPROB_KERNEL_ENV) or None
    if value not in (None, "torch", "triton"):
        raise DagrlError(
            f"environment variable {LOGPROB_KERNEL_ENV}={value!r}: use 'torch' or 'triton', or unset "
            "it for the default (Triton kernels on CUDA, torch passes elsewhere)"
        )
    if value == "triton" and importlib.util.find_spec("triton") is None:
        raise DagrlError(
            f"environment variable {LOGPROB_KERNEL_ENV}=triton but triton is not installed: "
            "pip install triton, or unset the variable"
        )
    return value


def response_logprobs(
    logits: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    vocab_size: int,
    entropy: bool,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(targets) [N], entropy [N] or None), fp32, differentiable with respect to `logits`.

    logits: [S, B, V/TP] this rank's vocabulary shard (columns rank*V/TP ..), any float dtype.
    rows, positions: [N] long: token n's logits are logits[positions[n], rows[n]]; pairs must be
        distinct (the backward writes each row's gradient once).
    targets: [N] long, ids in the full vocabulary.
    vocab_size: the real vocabulary; shard columns past it (TP padding) get probability 0.
    group: the tensor-parallel group the vocabulary is split over (None or size 1: not split).
    """
    shard = logits.shape[-1]
    tp_rank = dist.get_rank(group) if group is not None and group.size() > 1 else 0
    start = tp_rank * shard
    valid = max(0, min(shard, vocab_size - start))
    local = targets - start
    local = torch.where((local >= 0) & (local < valid), local, -1)
    flat = logits.view(-1, shard)  # a view: the output layer's logits are contiguous
    src = positions * logits.shape[1] + rows
    return _LogprobEntropy.apply(flat, src, local, 1.0 / temperature, valid, entropy, group)


class _LogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat, src, local, inv_t, valid, entropy, group):
        ctx.set_materialize_grads(False)  # a detached entropy (a metric only) gets no backward pass
        m, s, w = _kernels(flat).stats(flat, src, inv_t, valid, entropy)
        picked = flat[src, local.clamp(min=0)].float() * inv_t
        t = torch.where(local >= 0, picked, 0.0)  # the target logit, on the rank that holds it
        if group is not None and group.size() > 1:
            top = m.clone()
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            scale = torch.exp(m - top)
            sums = torch.stack([s * scale, w * scale if entropy else s, t])
            dist.all_reduce(sums, group=group)
            s, w, t, m = sums[0], sums[1], sums[2], top
        lse = m + s.log()
        logprobs = t - lse
        ent = lse - w / s if entropy else None
        ctx.save_for_backward(flat, src, local, lse, ent if entropy else lse)
        ctx.inv_t, ctx.valid, ctx.entropy = inv_t, valid, entropy
        if entropy:
            return logprobs, ent
        return logprobs

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy=None):
        flat, src, local, lse, ent = ctx.saved_tensors
        if grad_logprobs is None:
            grad_logprobs = torch.zeros_like(lse)
        if not ctx.entropy or grad_entropy is None:
            grad_entropy = None
        grad = torch.zeros_like(flat)
        _kernels(flat).grad(
            grad,
            flat,
            src,
            local,
            lse,
            ent,
            grad_logprobs.float().contiguous(),
            grad_entropy,
            ctx.inv_t,
            ctx.valid,
        )
        return grad, None, None, None, None, None, None


def _kernels(flat: torch.Tensor):
    """Triton on CUDA (or under TRITON_INTERPRET=1 in tests), torch otherwise;
    DAGRL_LOGPROB_KERNEL=torch|triton forces one (checked by validate before workers start)."""
    forced = logprob_kernel_override()
    if forced == "triton" or (forced is None and flat.is_cuda and triton is not None):
        return _TritonPasses
    return _TorchPasses


# ---- torch: chunks of tokens, fp32 ----------------------------------------------------------------
class _TorchPasses:
    @staticmethod
    def _rows(flat, src, inv_t, valid):
        x = flat[src].float()
        if inv_t != 1.0:
            x.mul_(inv_t)
        if valid < flat.shape[1]:
            x[:, valid:] = NEG
        return x

    @staticmethod
    def _chunk(flat) -> int:
        return max(1, _CHUNK_BYTES // (4 * flat.shape[1]))

    @staticmethod
    def stats(flat, src, inv_t, valid, entropy):
        ms, ss, ws = [], [], []
        step = _TorchPasses._chunk(flat)
        for i in range(0, len(src), step):
            x = _TorchPasses._rows(flat, src[i : i + step], inv_t, valid)
            m = x.max(dim=1).values
            e = torch.exp(x - m[:, None])
            ms.append(m)
            ss.append(e.sum(dim=1))
            ws.append((e * x).sum(dim=1) if entropy else ss[-1])
        return torch.cat(ms), torch.cat(ss), torch.cat(ws)

    @staticmethod
    def grad(grad, flat, src, local, lse, ent, g_lp, g_ent, inv_t, valid):
        step = _TorchPasses._chunk(flat)
        for i in range(0, len(src), step):
            sl = slice(i, i + step)
            logp = _TorchPasses._rows(flat, src[sl], inv_t, valid).sub_(lse[sl, None])
            p = logp.exp()
            coef = g_lp[sl] if g_ent is None else g_lp[sl] + g_ent[sl] * ent[sl]
            if g_ent is None:
                g = p.mul_(-coef[:, None])
            else:
                g = logp.mul_(-g_ent[sl, None]).sub_(coef[:, None]).mul_(p)
            here = local[sl] >= 0
            g[torch.arange(len(g), device=g.device)[here], local[sl][here]] += g_lp[sl][here]
            if inv_t != 1.0:
                g.mul_(inv_t)
            if valid < flat.shape[1]:
                g[:, valid:] = 0.0
            grad[src[sl]] = g.to(grad.dtype)


# ---- triton: one program per token, a loop over the vocabulary ------------------------------------
if triton is not None:
    _NEG = tl.constexpr(NEG)  # compiled kernels read module globals only as constexpr

    @triton.jit
    def _stats_kernel(
        flat_ptr, src_ptr, m_ptr, s_ptr, w_ptr, stride, valid, inv_t,
        N_COLS: tl.constexpr, ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0)
        base = flat_ptr + tl.load(src_ptr + i).to(tl.int64) * stride
        m = tl.max(tl.full([BLOCK], _NEG, tl.float32), axis=0)
        s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        w = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        for start in range(0, N_COLS, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < N_COLS, other=0.0).to(tl.float32) * inv_t
            x = tl.where(cols < valid, x, _NEG)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            scale = tl.exp(m - m_new)
            e = tl.exp(x - m_new)
            s = s * scale + tl.sum(e, axis=0)
            if ENTROPY:
                w = w * scale + tl.sum(e * x, axis=0)
            m = m_new
        tl.store(m_ptr + i, m)
        tl.store(s_ptr + i, s)
        tl.store(w_ptr + i, w)

    @triton.jit
    def _grad_kernel(
        grad_ptr, flat_ptr, src_ptr, local_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr,
        stride, valid, inv_t, N_COLS: tl.constexpr, ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0)
        row = tl.load(src_ptr + i).to(tl.int64) * stride
        target = tl.load(local_ptr + i)
        lse = tl.load(lse_ptr + i)
        g_lp = tl.load(glp_ptr + i)
        coef = g_lp
        g_ent = 0.0
        if ENTROPY:
            g_ent = tl.load(gent_ptr + i)
            coef = g_lp + g_ent * tl.load(ent_ptr + i)
        for start in range(0, N_COLS, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(flat_ptr + row + cols, mask=cols < N_COLS, other=0.0).to(tl.float32) * inv_t
            logp = x - lse
            p = tl.exp(logp)
            if ENTROPY:
                g = -p * (coef + g_ent * logp)
            else:
                g = -p * coef
            g = tl.where(cols == target, g + g_lp, g)
            g = tl.where(cols < valid, g * inv_t, 0.0)
            tl.store(grad_ptr + row + cols, g.to(grad_ptr.dtype.element_ty), mask=cols < N_COLS)


class _TritonPasses:
    @staticmethod
    def _block(n_cols: int) -> int:
        return max(16, min(4096, triton.next_power_of_2(n_cols)))

    @staticmethod
    def stats(flat, src, inv_t, valid, entropy):
        n, n_cols = len(src), flat.shape[1]
        m, s, w = (torch.empty(n, dtype=torch.float32, device=flat.device) for _ in range(3))
        if n:
            _stats_kernel[(n,)](
                flat, src, m, s, w, flat.stride(0), valid, inv_t,
                N_COLS=n_cols, ENTROPY=entropy, BLOCK=_TritonPasses._block(n_cols), num_warps=8,
            )  # fmt: skip
        return m, s, w

    @staticmethod
    def grad(grad, flat, src, local, lse, ent, g_lp, g_ent, inv_t, valid):
        n, n_cols = len(src), flat.shape[1]
        if not n:
            return
        entropy = g_ent is not None
        _grad_kernel[(n,)](
            grad, flat, src, local, lse, ent, g_lp, g_ent.float().contiguous() if entropy else g_lp,
            flat.stride(0), valid, inv_t,
            N_COLS=n_cols, ENTROPY=entropy, BLOCK=_TritonPasses._block(n_cols), num_warps=8,
        )  # fmt: skip
