"""The host memory megatron-core's CPU optimizer holds (megatron.optimizer_cpu_offload): pinned
blocks, each rounded up to a power of two, and pageable fp32 state.

megatron-core 0.16.1 builds HybridDeviceOptimizer (optimizer/cpu_offloading/hybrid_optimizer.py)
twice under the distributed optimizer: get_megatron_optimizer (optimizer/__init__.py) over the
model's parameters, whole, then DistributedOptimizer.__init__ (distrib_optimizer.py ~602) again
over this rank's shards: 1-D slices of each parameter's range in its grad-buffer bucket's
DP-th part (_build_model_gbuf_param_range_map), in the order of megatron's param groups (the 2-D
weights, then the norms and biases, which take no weight decay), each group in the buffer's order
(the parameters reversed, param_and_grad_buffer.py). With use_precision_aware_optimizer the shards
are views of the 16-bit parameters; without it the distributed optimizer's fp32 main-param shards
(_build_model_and_main_param_groups, ~440).
For each tensor the offloaded share takes, in turn (optimizer_offload_fraction: a prefix of the
list, tensors taken until their elements reach that share), HybridDeviceOptimizer
_get_sub_optimizer_param_groups does:
- `param.detach().clone().cpu().pin_memory()` (~274): a pinned copy in the tensor's dtype, whatever
  OptimizerConfig.pin_cpu_params says (read nowhere; it and pin_cpu_grads are True by default,
  optimizer_config.py ~322, and dagrl sets neither);
- for a 16-bit tensor, `.clone().float()` (~278, param_update_in_fp32=True): the fp32 master, a
  pageable tensor (neither clone nor a dtype cast keeps the pinning); the pinned 16-bit copy is
  dropped at once and its block goes back to torch's pinned cache, which keeps it;
- for an fp32 tensor (precision-aware off, or fp32 params) the pinned copy is the master;
and at the first step _set_sub_optimizer_grads (~110) makes each CPU tensor's gradient,
`torch.empty(..., pin_memory=pin_cpu_grads)`: pinned fp32. torch's AdamW then makes exp_avg and
exp_avg_sq with zeros_like of the CPU master: pageable fp32 (its step is a 0-d tensor).

torch's pinned allocator (CachingHostAllocator, ATen/core/CachingHostAllocator.h ~300) rounds every
block up to a power of two and caches a freed block for the next request of the same power,
never returning it. So the 16-bit copies leave one cached block per power of two they took, which
a later gradient of that power reuses; the first optimizer's fp32 copies (fp32 params) are freed
when the garbage collector breaks its reference cycle (its step hooks hold it), which dagrl's
worker runs after building the roles (freeze_heap), and the gradients then reuse those blocks.
`listed_host_bytes` replays that sequence over megatron's tensors (`stage_tensors`, `rank_shards`).

Per parameter, at DP 1 in bf16 with the masters on the host (the default): 12 pageable bytes
(master, m, v), the pinned fp32 gradients (4 bytes rounded up: 5.3-5.5 bytes at these shapes)
and the cached bf16 copies no gradient's power takes (the vocabulary matrix's block, 0.5-2 GiB;
at 8B also linear_proj's 32 MiB). Qwen3 shapes, vocabulary 151936, TP 1, derived from megatron-core 0.16.1's and
torch's source, not measured on a card (2026-11-28), against 16 bytes a parameter before:
- 0.6B: 3.47 GiB pinned + 6.66 pageable = 10.13 (8.88);
- 1.7B: 9.57 + 19.23 = 28.80 (25.64);
- 4B: 21.03 + 44.95 = 65.99 (59.94);
- 8B: 43.78 + 91.54 = 135.32 (122.05); at TP 2 21.89 + 45.77 = 67.66 (61.03); at DP 2 the
  larger rank 22.91 + 45.77 = 68.68 (61.03): its pieces round up apart, and the first optimizer's
  whole-parameter bf16 copies leave blocks no shard's gradient takes.
Not counted: while the roles are built the first optimizer's pageable fp32 masters (4 bytes a
parameter) live beside the second's until that collection (a peak of the build, not of a step);
other pinned users (HostStore's slabs, a sleeping vLLM engine's backup) share the cache and may
take a cached block of their size, so counting each apart can only be high. Without the
distributed optimizer megatron's Float16Optimizer puts its own fp32 copies of a 16-bit model's
parameters in the first optimizer's groups, which its step cannot look up (KeyError at the first
step, run on the CPU): that is refused (precision_rules.py), so the second optimizer is always
there.

Where the tensors cannot be listed (MoE, layouts tensor_numels does not know), `bounded_host_bytes`:
the pageable bytes as above, every pinned fp32 tensor at twice its bytes (a power of two at most
doubles it) and the cached 16-bit copies at twice the largest tensor's rounded bytes (one block
for each power of two below it).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from typing import NamedTuple

from dagrl.backends.model_shape import ModelShape, tensor_numels

PARAM_ALIGN = 64  # elements: where each parameter starts in megatron's grad buffer (distributed optimizer)
BUCKET_ALIGN = 128  # elements: a bucket ends on lcm(DP, this)


class Tensor(NamedTuple):
    """A parameter as megatron lays it out on a device."""

    numel: int
    decayed: bool  # in the weight-decay param group (2-D weights; not the norms and biases)
    width: int  # bytes per element
    own_bucket: bool = False  # a tied embedding under PP: a grad-buffer bucket of its own


def stage_tensors(
    shape: ModelShape, width: int, tp: int, pp: int, stage: int, value_head: bool = False
) -> list[Tensor] | None:
    """The parameters of pipeline stage `stage` on one TP rank, in megatron's named_parameters
    order (GPTModel: the embedding; per layer the input norm, linear_proj, linear_qkv (its bias),
    the q/k norms, the pre-MLP norm, linear_fc1 (gate and up), linear_fc2; the final norm and the
    output layer), as the sdpa and local layer specs build them (the TE spec folds the two layer
    norms into linear_qkv and linear_fc1: the same tensors, in another order). Linears split over
    TP, norms whole; a tied embedding is a copy on the last stage under PP, in a bucket of its own.
    `value_head`: the critic's trunk with a [1, hidden] fp32 head and its bias for the output layer.
    None where tensor_numels cannot list the shape."""
    numels = tensor_numels(shape)
    if numels is None:
        return None
    h, q, kv, d, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.head_dim, shape.intermediate
    per_layer = (len(numels) - 2 - (not shape.tied)) // shape.layers
    qkv_bias = per_layer == 12 + 2 * shape.qk_norm  # HF's 9 (+2 q/k norms) + q, k, v biases
    qkv = (q + 2 * kv) // tp
    layer = [
        Tensor(h, False, width),  # input_layernorm
        Tensor(h * q // tp, True, width),  # linear_proj
        Tensor(qkv * h, True, width),  # linear_qkv
        *([Tensor(qkv, False, width)] if qkv_bias else []),
        *([Tensor(d, False, width)] * 2 if shape.qk_norm else []),  # q_layernorm, k_layernorm
        Tensor(h, False, width),  # pre_mlp_layernorm
        Tensor(2 * i // tp * h, True, width),  # linear_fc1
        Tensor(i // tp * h, True, width),  # linear_fc2
    ]
    vocab = Tensor(shape.vocab * h // tp, True, width, own_bucket=shape.tied and pp > 1)
    out = [vocab] if stage == 0 else []
    out += layer * -(-shape.layers // pp)
    if stage == pp - 1:
        out.append(Tensor(h, False, width))  # final_layernorm
        if value_head:
            out += [Tensor(h, True, 4), Tensor(1, False, 4)]
        elif not shape.tied or pp > 1:
            out.append(vocab)  # output_layer (a tied embedding's copy under PP)
    return out


def rank_shards(tensors: list[Tensor], dp: int, rank: int) -> list[tuple[int, int]]:
    """(index into `tensors`, elements) of each piece DP rank `rank` owns under the distributed
    optimizer, in its optimizer's parameter order: megatron's _ParamAndGradBuffer, one per dtype,
    lays its parameters out in reverse, each starting on 64 elements, in one bucket
    (overlap_grad_reduce is off) but for a tied embedding's own, each bucket padded to
    lcm(DP, 128) elements and cut in DP equal parts; the optimizer lists the pieces by param group
    (weight decay first), fp32 before 16-bit within a group, each in buffer order."""
    owned = {}
    for width in dict.fromkeys(t.width for t in tensors):  # a buffer per dtype, first met first
        index = [k for k, t in enumerate(tensors) if t.width == width][::-1]
        spans, buckets = _buffer_layout([tensors[k] for k in index], dp)
        for k, (start, end) in zip(index, spans):
            n = sum(
                _overlap(start, end, lo + rank * (hi - lo) // dp, lo + (rank + 1) * (hi - lo) // dp)
                for lo, hi in buckets
            )
            if n:
                owned[k] = n
    order = sorted(owned, key=lambda k: (not tensors[k].decayed, tensors[k].width != 4, -k))
    return [(k, owned[k]) for k in order]


def _buffer_layout(tensors: list[Tensor], dp: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(each tensor's [start, end) in the buffer, each bucket's [start, end)): megatron-core
    0.16.1's _ParamAndGradBuffer.__init__ under the distributed optimizer, bucket_size None."""
    divisor = math.lcm(dp, BUCKET_ALIGN)
    spans: list[tuple[int, int]] = []
    buckets: list[tuple[int, int]] = []
    start = bucket_start = 0
    held = 0  # tensors in the open bucket

    def close(end: int) -> int:
        nonlocal bucket_start, held
        padded = -(-end // divisor) * divisor
        buckets.append((bucket_start, padded))
        bucket_start, held = padded, 0
        return padded

    for numel, _, _, own_bucket in tensors:
        start = -(-start // PARAM_ALIGN) * PARAM_ALIGN
        if own_bucket and held:
            start = close(start)
        spans.append((start, start + numel))
        held += 1
        start = close(start + numel) if own_bucket else start + numel
    if held:
        close(spans[-1][1])
    return spans, buckets


def _overlap(start: int, end: int, lo: int, hi: int) -> int:
    return max(0, min(end, hi) - max(start, lo))


class _PinnedCache:
    """torch's CachingHostAllocator as these requests meet it: each rounded up to a power of two,
    served by a cached free block of that size if one is there, else by a new one; a freed block
    is cached, never returned. `pinned`: the bytes of every block made."""

    def __init__(self) -> None:
        self.free: Counter[int] = Counter()
        self.pinned = 0

    def take(self, nbytes: int) -> int:
        size = 1 << max(0, nbytes - 1).bit_length()
        if self.free[size]:
            self.free[size] -= 1
        else:
            self.pinned += size
        return size

    def give(self, size: int) -> None:
        self.free[size] += 1


def _offloaded(tensors: list[tuple[int, int]], fraction: float) -> list[tuple[int, int]]:
    """The (elements, width) HybridDeviceOptimizer moves to the CPU: in list order while the
    elements taken are below `fraction` of all (_get_sub_optimizer_param_groups)."""
    threshold, taken, out = fraction * sum(n for n, _ in tensors), 0, []
    for n, width in tensors:
        if taken < threshold:
            out.append((n, width))
            taken += n
    return out


def replay(
    whole: list[tuple[int, int]], shards: list[tuple[int, int]], masters_on_host: bool
) -> tuple[int, int]:
    """(pinned, pageable) bytes after the CPU optimizer's build and first step (module docstring):
    `whole` the (elements, width) the first optimizer moves to the CPU, `shards` the second's."""
    cache, held, pageable = _PinnedCache(), [], 0
    # the first optimizer: a pinned copy of each tensor (its pageable fp32 masters of 16-bit ones
    # are dropped when the second is built)
    for n, width in whole:
        size = cache.take(width * n)
        if width == 4:
            held.append(size)
        else:
            cache.give(size)
    for n, width in shards:
        if width < 4 and masters_on_host:  # a 16-bit copy, dropped for its pageable fp32 master
            cache.give(cache.take(width * n))
            pageable += 4 * n
        else:  # the fp32 shard (or main-param shard) pinned: the master
            cache.take(4 * n)
    for size in held:  # the first optimizer, collected
        cache.give(size)
    for n, _ in shards:  # the first step's pinned fp32 gradients
        cache.take(4 * n)
    return cache.pinned, pageable + 8 * sum(n for n, _ in shards)


@functools.lru_cache(maxsize=256)
def listed_host_bytes(
    shape: ModelShape,
    width: int,
    tp: int,
    pp: int,
    dp: int,
    fraction: float,
    masters_on_host: bool,
    stage: int | None = None,
    value_head: bool = False,
) -> tuple[int, int] | None:
    """(pinned, pageable) bytes of the CPU optimizer of one device of pipeline stage `stage` (None:
    the stage that holds the most) under the distributed optimizer, which shards over `dp` ranks
    (DP x CP), with `fraction` of its parameters offloaded, on the DP rank that holds the most;
    None where the tensors cannot be listed (stage_tensors)."""
    if not fraction:
        return 0, 0
    out = []
    for s in range(pp) if stage is None else (stage,):
        tensors = stage_tensors(shape, width, tp, pp, s, value_head)
        if tensors is None:
            return None
        named = [(t.numel, t.width) for decayed in (True, False) for t in tensors if t.decayed == decayed]
        whole = _offloaded(named, fraction)
        for rank in range(dp):
            shards = [(n, tensors[k].width) for k, n in rank_shards(tensors, dp, rank)]
            out.append(replay(whole, _offloaded(shards, fraction), masters_on_host))
    return max(out, key=sum)


def largest_tensor(shape: ModelShape, tp: int, ep: int, etp: int) -> int:
    """Elements of no fewer than any one parameter tensor of `shape` on a device: the vocabulary
    matrix's TP shard, a layer's non-expert parameters, or a layer's expert parameters on the
    device (a grouped GEMM holds them in one or two tensors)."""
    ends = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    dense = max(0, shape.params - shape.expert_params - ends) // shape.layers
    return max(shape.vocab * shape.hidden // tp, dense, shape.expert_params // shape.layers // (ep * etp))


def bounded_host_bytes(
    elements: float, whole: float, largest: int, width: int, masters_on_host: bool, sharded: bool
) -> tuple[float, float]:
    """(pinned, pageable) bytes no fewer than the CPU optimizer holds for `elements` offloaded
    elements on a device (`whole`: the same before the distributed optimizer shards them), where
    its tensors cannot be listed: each pinned fp32 tensor at twice its bytes, the cached 16-bit
    copies (one block a power of two, the largest below twice `largest`'s) at 4x `largest`'s bytes;
    the first optimizer's whole fp32 copies, cached after it is collected, at twice theirs when
    the shards are smaller (`sharded`)."""
    pinned_masters = width == 4 or not masters_on_host
    pinned = 2 * 4 * elements * (2 if pinned_masters else 1)
    if width < 4:
        pinned += 4 * width * largest
    elif sharded:
        pinned += 2 * 4 * whole
    return pinned, (8 if pinned_masters else 12) * elements
