"""What the engine asks of backends. Implementations: train `torch` (and `megatron`), rollout `hf`
(and `vllm`), standalone teacher `vllm`.

Batch-taking methods receive this worker's DP shard and return (output Batch, metrics). How each
call is spread over the pool is declared here with `@role_method` (dagrl/core/calls.py);
implementations inherit nothing and need not repeat it. `dp_info` tells the pool which outputs
to keep (e.g. only TP rank 0 of each DP group). The driver calls these through the typed handles
in dagrl/backends/handles.py; weight export/import through dagrl/backends/weight_sync.py.

RolloutBackend will gain sleep/wake and GPU-side weight transfer; new methods get a declaration
here and a typed method on RolloutRole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from dagrl.core.batch import Batch
from dagrl.core.calls import Collect, Dispatch, Execute, role_method

WeightBucket = dict[str, torch.Tensor]


class DeviceTenant(Protocol):
    """What every backend on a (possibly shared) device offers: its DP position, and leaving /
    returning to the device between its turns."""

    def dp_info(self) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, returns_output)."""
        ...

    def offload(self) -> bool | None:
        """Move state off the accelerator so a colocated role can use it; False = kept resident
        by configuration (nothing freed)."""
        ...

    def onload(self) -> None: ...


class TrainBackend(DeviceTenant, Protocol):
    """A train backend (torch, megatron): log-probs, a teacher's top-k or hidden states when
    forward-only, the update with the configured objective, weights out for the rollout, and
    checkpoints. Built from its role's spec; tests/backends/test_contract.py is its contract."""

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, dict]:
        """Log-probs [B, R] of `responses` given `prompts`, under output_key."""
        ...

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, dict]:
        """A forward-only teacher's top-k next tokens at each response position of `responses`
        given `prompts`: teacher_topk_ids / teacher_topk_logprobs [B, R, K] (log-probs over the
        whole vocabulary at `temperature`)."""
        ...

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def teacher_hidden(self, batch: Batch) -> tuple[Batch, dict]:
        """A forward-only teacher's final hidden states (after the final norm, what its output
        layer maps to logits) at the positions predicting each response token: teacher_hidden
        [B, R, H'] in the model's dtype. Full-vocabulary distillation: H' ≪ V."""
        ...

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        """PPO epochs × mini-batches × micro-batches on this shard; returns metrics."""
        ...

    def export_weights(self, to_cpu: bool = False) -> Iterator[WeightBucket]:
        """HF-named parameters in buckets of about rollout.weight_sync_bucket_mb."""
        ...

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def save(self, path: str) -> None:
        """Every rank writes its part (sharded backends save collectively)."""
        ...

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def load(self, path: str) -> None: ...

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def export_hf(self, path: str) -> None:
        """Write a HF model directory (config, safetensors, tokenizer) that transformers loads."""
        ...


class RolloutBackend(DeviceTenant, Protocol):
    """A rollout engine (hf, vllm): sampling with the rollout's log-probs, and the weight refresh
    (begin, load buckets or write straight into `engine_params`, finish)."""

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def generate(self, batch: Batch, seed: int, validate: bool = False) -> tuple[Batch, dict]:
        """One response per row: responses, response_mask, rollout_logprobs."""
        ...

    def begin_weight_update(self) -> None:
        """Make room for new weights only (a sleeping engine wakes its weights, not its KV cache)."""
        ...

    def engine_params(self) -> dict[str, torch.Tensor] | None:
        """The engine's own parameters, written in place by a direct weight refresh
        (weight_layout.py); None when a rank's parameters are not whole rows of HF tensors."""
        ...

    def load_weights(self, buckets: Iterable[WeightBucket]) -> int:
        """Copy HF-named weights in; returns bytes received."""
        ...

    def finish_weight_update(self) -> None:
        """After the trainer has left the device: take the rest (KV cache); drop stale caches."""
        ...


class TeacherBackend(DeviceTenant, Protocol):
    """A standalone teacher (teacher.placement=standalone): replicas on devices of their own."""

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, dict]:
        """As TrainBackend.teacher_topk; the teacher reads `teacher_prompts` instead of `prompts`
        when the batch has them (OPSD)."""
        ...


class CriticBackend(DeviceTenant, Protocol):
    """PPO's value model (critic.*, role critic): values of the sampled responses, its update with
    the clipped value loss against the returns, and checkpoints."""

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def compute_values(self, batch: Batch) -> tuple[Batch, dict]:
        """values [B, R]: the value at the position predicting each response token."""
        ...

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        """critic.ppo_epochs × mini-batches × micro-batches on this shard (values, returns)."""
        ...

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def save(self, path: str) -> None: ...

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def load(self, path: str) -> None: ...
