"""Memory of the torch train backend (HF transformers model, AdamW, DDP) per device, in bytes.

State per parameter (w = bytes of the model dtype): weights w and gradients w; AdamW keeps m and v
in fp32 (8 B) and, for bf16/fp16 weights, an fp32 master copy (4 B): 16 B per trained parameter in
bf16, as megatron's mixed precision. With the optimizer step on the host (actor.optimizer_cpu_offload)
the device keeps weights and gradients only. `actor.offload` moves weights and optimizer state to
host memory while a colocated role has the device; gradients stay (they live until the next
update's zero_grad).

Activations per token per layer of an HF decoder layer, counted on the tensors autograd saves
(CPU, sdpa attention, Qwen3 shapes; the norms upcast to fp32): (8 + 4w)·h + (4 + 3w)·(q + kv) +
4w·i bytes, h hidden, q/kv the query/key-value widths, i the MLP width. With gradient
checkpointing each layer keeps its input (w·h) and one layer is recomputed at a time. The logits:
the GPU path runs the output layer on the R + 1 response positions only and keeps those logits
in the model dtype; the backward adds their gradient of the same size. Gradients in the compute
dtype exist only during the update when fp32 masters (or the host step) take them.
"""

from __future__ import annotations

from dagrl.backends.memory import Workload
from dagrl.backends.model_shape import ModelShape


def state_bytes(
    shape: ModelShape, width: int, trains: bool, optimizer_on_host: bool = False
) -> dict[str, float]:
    """Weights, gradients and optimizer state on the device while the role runs."""
    parts = {"weights": float(shape.params * width)}
    if not trains:
        return parts
    parts["grads"] = float(shape.params * width)
    if not optimizer_on_host:
        master = 4 if width < 4 else 0  # fp32 master weights for bf16/fp16 compute weights
        parts["optimizer"] = float(shape.params * (8 + master))
    return parts


def between_updates(state: dict[str, float], width: int, optimizer_on_host: bool) -> dict[str, float]:
    """What the role keeps outside its update: the compute-dtype gradients live only from the
    backward to the optimizer step when fp32 masters take them (bf16/fp16 weights) or the step
    runs on the host (both free them as they are read: mixed_precision.py); fp32 AdamW on the
    weights themselves keeps them until the next update's zero_grad."""
    if width < 4 or optimizer_on_host:
        return {k: v for k, v in state.items() if k != "grads"}
    return dict(state)


def idle_bytes(state: dict[str, float], offload: bool) -> dict[str, float]:
    """What stays on the device while a colocated role has it (`state` as between_updates gives
    it): everything, or the gradients when the role offloads (weights and optimizer state wait in
    host memory)."""
    if not offload:
        return dict(state)
    return {k: v for k, v in state.items() if k == "grads"}


def layer_activation_bytes(shape: ModelShape, width: int) -> float:
    """Bytes one decoder layer saves for the backward, per token."""
    h, qkv, i = shape.hidden, shape.q_dim + shape.kv_dim, shape.intermediate
    return (8 + 4 * width) * h + (4 + 3 * width) * qkv + 4 * width * i


def update_bytes(shape: ModelShape, width: int, work: Workload, recompute: bool) -> dict[str, float]:
    """Activations and logits of one micro-batch's forward + backward."""
    layer = layer_activation_bytes(shape, width) * work.tokens
    if recompute:  # every layer's input, and one layer's activations while it is recomputed
        activations = shape.layers * width * shape.hidden * work.tokens + layer
    else:
        activations = shape.layers * layer
    logits = 2 * width * work.rows * (work.response + 1) * shape.vocab  # logits + their gradient
    return {"activations": float(activations), "logits": float(logits)}


def forward_bytes(shape: ModelShape, width: int, work: Workload) -> dict[str, float]:
    """A no-grad forward (log-probs, a teacher): one layer's tensors live at a time and are gone
    before the output layer makes the logits, so the peak is the larger of the two (measured on an
    H100: 0.6B and 1.7B Qwen3 shapes, 64 rows x 640 tokens, within 3 %; docs/perf.md)."""
    layer = float(layer_activation_bytes(shape, width) * work.tokens)
    logits = float(width * work.rows * (work.response + 1) * shape.vocab)
    return {"logits": logits} if logits >= layer else {"activations": layer}
