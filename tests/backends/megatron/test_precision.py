"""bf16 trains on megatron: its optimizer keeps fp32 main params (OptimizerConfig bf16=True), so a
few steps at lr 1e-6 move them as fp32 training moves its weights (tests/backends/precision_check.py)."""

from __future__ import annotations

import pytest
import torch

from tests.backends.megatron.test_backend import INPUT_KEYS, _backend, make_batch, megatron_config
from tests.backends.precision_check import LR, STEPS, assert_update_matches_fp32, flat_update
from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")


def _main_params(optimizer) -> list[torch.Tensor]:
    """The tensors megatron's optimizer updates: fp32 main params (fp32 shards of the model's own
    params when they are fp32)."""
    return [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]


def _update(rank: int, world: int, cfg, batch):
    backend = _backend(cfg, rank, world)
    old, _ = backend.forward_logprobs(batch.select(INPUT_KEYS), "old_logprobs")
    batch = batch.union(old)
    before = _main_params(backend.optimizer)
    assert all(p.dtype == torch.float32 for p in before)
    for _ in range(STEPS):
        backend.train_step(batch)
    return flat_update(before, _main_params(backend.optimizer))


def test_bf16_update_matches_fp32():
    batch = make_batch()
    updates = {}
    for dtype in ("float32", "bfloat16"):
        cfg = megatron_config(*LR, f"actor_rollout_ref.actor.megatron.param_dtype={dtype}")
        [updates[dtype]] = run_distributed(_update, 1, cfg, batch)
    assert_update_matches_fp32(updates["bfloat16"], updates["float32"])
