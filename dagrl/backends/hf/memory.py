"""Memory of the hf rollout (transformers `generate`) per device, in bytes: the weights, the KV
cache of the sequences generated at once, and one step's fp32 logits. While colocated roles run,
its model waits in host memory."""

from __future__ import annotations

from dagrl.backends.memory import Workload
from dagrl.backends.model_shape import ModelShape


def generate_bytes(shape: ModelShape, width: int, work: Workload) -> dict[str, float]:
    kv_cache = 2 * shape.layers * shape.kv_dim * width * work.tokens
    return {
        "weights": float(shape.params * width),
        "kv_cache": float(kv_cache),
        "logits": float(4 * work.rows * shape.vocab),
    }
