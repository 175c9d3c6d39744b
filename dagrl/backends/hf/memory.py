"""Memory of the hf rollout (transformers `generate`) per device, in bytes: the weights, the KV
cache of the sequences generated at once, and one step's fp32 logits. While colocated roles run,
its model waits in host memory."""

from __future__ import annotations

from dagrl.backends.memory import RoleMemory, Workload, param_width, workload
from dagrl.backends.model_shape import ModelShape


def generate_bytes(shape: ModelShape, width: int, work: Workload) -> dict[str, float]:
    kv_cache = 2 * shape.layers * shape.kv_dim * width * work.tokens
    return {
        "weights": float(shape.params * width),
        "kv_cache": float(kv_cache),
        "logits": float(4 * work.rows * shape.vocab),
    }


def role_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The hf backend's registered estimate: weights while it runs, the KV cache and logits of a
    micro-batch while it generates; offload() moves its model to the CPU between its turns."""
    work = workload(cfg, spec.micro_batch_size, None, layout.dp)
    parts = generate_bytes(shape, param_width(spec.model.dtype), work)
    weights = {"weights": parts.pop("weights")}
    return RoleMemory(weights, {}, {"rollout": parts})


def score_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """A reward model's registered estimate (orm, prm, GRPO's rm): weights while it scores, one
    micro-batch's forward (no KV cache grows: one pass, no sampling): the widest layer's live
    activations (hidden states, q/k/v and the MLP's intermediate) and a score per token; its model
    waits in host memory between its turns."""
    work = workload(cfg, spec.micro_batch_size, None, layout.dp)
    width = param_width(spec.model.dtype)
    activations = work.tokens * width * (4 * shape.hidden + 2 * shape.intermediate)
    weights = {"weights": float(shape.params * width)}
    return RoleMemory(
        weights, {}, {"score": {"activations": float(activations), "scores": 4.0 * work.tokens}}
    )
