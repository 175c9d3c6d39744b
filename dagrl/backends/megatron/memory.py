"""Memory of the megatron train backend per device, in bytes (pure: no megatron import).

State: dense weights split over TP×PP, expert weights over expert-TP×EP×PP, in param_dtype; fp32
gradient buffers (grad_reduce_in_fp32); Adam's m and v in fp32 plus fp32 master weights (unless
the params are fp32), split over the data-parallel ranks by the distributed optimizer. With
optimizer_cpu_offload a share (optimizer_offload_fraction) of that state and its step live on the
host. param_offload / grad_offload / optimizer_offload move their part to host memory while a
colocated role has the device; the role's own phases have everything back.

Activations per token per layer (TE or sdpa layer spec, flash attention, w = bytes of
param_dtype): the two norms' inputs and outputs 4w·h, q/k/v and their rotary copies
w·(2q + 3kv) (+ w·(q + kv) for the q/k norms' inputs), the attention output w·q, the MLP's gate/up
output, silu(gate) and their product 4w·i (fitted on an H100, docs/perf.md), and two
dropout masks 2h (one byte each; Qwen's dropout is 0 but the masks are made). Tensor parallel
splits the attention and MLP parts, sequence parallel the rest too; context parallel splits the
tokens. Full recompute keeps each recomputed layer's input (w·h) plus one layer at a time.
1F1B keeps up to PP micro-batches in flight on the first stage: L/PP layers × min(PP, micro-batches).
Logits are [S, B, V/TP] in param_dtype over every position; the update adds their gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.backends.memory import Workload
from dagrl.backends.model_shape import ModelShape

_WIDTH = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass(frozen=True)
class MegatronLayout:
    """A megatron role's parallel sizes on its devices."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1
    workers: int = 1
    sequence_parallel: bool = False


def param_width(param_dtype) -> int:
    return _WIDTH[getattr(param_dtype, "value", param_dtype)]


def state_bytes(
    shape: ModelShape,
    layout: MegatronLayout,
    param_dtype,
    trains: bool,
    distributed_optimizer: bool,
    optimizer_host_fraction: float = 0.0,
) -> tuple[dict[str, float], float]:
    """(weights, grads, optimizer bytes on the device while the role runs; optimizer bytes the
    CPU optimizer keeps on the host)."""
    dense, experts = shape.params - shape.expert_params, shape.expert_params
    local_dense = dense / (layout.tp * layout.pp)
    local_experts = experts / (layout.etp * layout.ep * layout.pp)
    width = param_width(param_dtype)
    parts = {"weights": (local_dense + local_experts) * width}
    if not trains:
        return parts, 0.0
    parts["grads"] = (local_dense + local_experts) * 4.0
    adam = 8 + (0 if width == 4 else 4)  # m, v (+ fp32 master weights)
    if distributed_optimizer:  # shards over DP×CP, experts over the expert-data-parallel ranks
        local_dense /= layout.dp * layout.cp
        local_experts /= max(1, layout.workers // (layout.etp * layout.ep * layout.pp))
    optimizer = adam * (local_dense + local_experts)
    parts["optimizer"] = optimizer * (1 - optimizer_host_fraction)
    return parts, optimizer * optimizer_host_fraction


def idle_bytes(state: dict[str, float], params: bool, grads: bool, optimizer: bool) -> dict[str, float]:
    """What stays on the device while a colocated role has it, given the three offload flags."""
    gone = {"weights": params, "grads": grads, "optimizer": optimizer}
    return {k: v for k, v in state.items() if not gone.get(k, False)}


def layer_activation_bytes(shape: ModelShape, width: int, layout: MegatronLayout) -> float:
    """Bytes one transformer layer saves for the backward, per token of the micro-batch."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    qk_norm = q + kv if shape.qk_norm else 0  # the q/k norms' inputs (Qwen3)
    # attention, the MLP (fc1's gate/up output, silu(gate), their product: 4i without TE's fused
    # SwiGLU), their inputs
    split = width * (2 * q + 3 * kv + qk_norm + q + 4 * i + 2 * h) / layout.tp
    replicated = 2 * width * h + 2 * h  # norm inputs, dropout masks: split by sequence parallel only
    if layout.sequence_parallel:
        replicated /= layout.tp
    return (split + replicated) / layout.cp


def update_bytes(
    shape: ModelShape,
    width: int,
    layout: MegatronLayout,
    work: Workload,
    recompute_layers: int = 0,
) -> dict[str, float]:
    """Activations and logits of the update's forward + backward; `recompute_layers`: layers per
    stage under full recompute (0 = none)."""
    stage_layers = shape.layers / layout.pp
    in_flight = min(layout.pp, work.micro_batches) if layout.pp > 1 else 1
    layer = layer_activation_bytes(shape, width, layout) * work.tokens
    recomputed = min(recompute_layers, stage_layers)
    kept_input = (
        width * shape.hidden * work.tokens / layout.cp / (layout.tp if layout.sequence_parallel else 1)
    )
    per_micro = (stage_layers - recomputed) * layer + recomputed * kept_input
    activations = per_micro * in_flight + (layer if recomputed else 0.0)
    logits = 2 * width * work.tokens / layout.cp * shape.vocab / layout.tp
    return {"activations": float(activations), "logits": float(logits)}


def forward_bytes(shape: ModelShape, width: int, layout: MegatronLayout, work: Workload) -> dict[str, float]:
    """A forward-only pass: one layer's tensors at a time, gone before the output layer makes the
    logits over every position; the peak is the larger of the two."""
    layer = float(layer_activation_bytes(shape, width, layout) * work.tokens)
    logits = float(width * work.tokens / layout.cp * shape.vocab / layout.tp)
    return {"logits": logits} if logits >= layer else {"activations": layer}
