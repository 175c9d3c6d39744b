"""What the engine asks of backends. Implementations: train `torch` (and `megatron`), rollout `hf` (and `vllm`).

Batch-taking methods receive this worker's DP shard and return (output Batch, metrics). Every method
is called on every worker of the role's pool; `dp_info` tells the pool which outputs to keep
(e.g. only TP rank 0 of each DP group).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from dagrl.core.batch import Batch

WeightBucket = dict[str, torch.Tensor]


class DeviceTenant(Protocol):
    def dp_info(self) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, returns_output)."""
        ...

    def offload(self) -> bool | None:
        """Move state off the accelerator so a colocated role can use it; False = kept resident
        by configuration (nothing freed)."""
        ...

    def onload(self) -> None: ...


class TrainBackend(DeviceTenant, Protocol):
    def forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, dict]:
        """Log-probs [B, R] of `responses` given `prompts`, under output_key."""
        ...

    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        """PPO epochs × mini-batches × micro-batches on this shard; returns metrics."""
        ...

    def export_weights(self, to_cpu: bool = False) -> Iterator[WeightBucket]:
        """HF-named parameters in buckets of about rollout.weight_sync_bucket_mb."""
        ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...

    def export_hf(self, path: str) -> None:
        """Write a HF model directory (config, safetensors, tokenizer) that transformers loads."""
        ...


class RolloutBackend(DeviceTenant, Protocol):
    def generate(self, batch: Batch, seed: int, validate: bool = False) -> tuple[Batch, dict]:
        """One response per row: responses, response_mask, rollout_logprobs."""
        ...

    def begin_weight_update(self) -> None:
        """Make room for new weights only (a sleeping engine wakes its weights, not its KV cache)."""
        ...

    def load_weights(self, buckets: Iterable[WeightBucket]) -> int:
        """Copy HF-named weights in; returns bytes received."""
        ...

    def finish_weight_update(self) -> None:
        """After the trainer has left the device: take the rest (KV cache); drop stale caches."""
        ...
