"""SFT's objective on the megatron backend (megatron-core on CPU under gloo) matches the torch
backend: the same NLL over the loss-masked tokens and the same updated weights, TP=1 and TP=2."""

from __future__ import annotations

import pytest
import torch

from tests.backends.megatron.test_backend import COMMON, M, _assert_weights_close, make_batch
from tests.conftest import compose_config
from tests.megatron_cpu_patch import run_distributed
from tests.train_backends import train_backend

pytest.importorskip("megatron.core")

SFT = (
    "algorithm=sft",
    "actor_rollout_ref.rollout.n=1",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
)


def sft_batch():
    import dagrl.objectives.sft  # noqa: F401  (declares loss_mask)
    from dagrl.core.batch import Batch

    batch = make_batch()
    g = torch.Generator().manual_seed(3)
    loss_mask = (torch.rand(batch["response_mask"].shape, generator=g) > 0.3).long() * batch["response_mask"]
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    return batch.select(keys).union(Batch({"loss_mask": loss_mask}))


def _megatron_step(rank: int, world: int, cfg, batch):
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.core.worker import ParallelContext

    backend = train_backend(
        MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cpu")), False
    )
    _, metrics = backend.train_step(batch)
    weights = {k: v.clone() for bucket in backend.export_weights(to_cpu=True) for k, v in bucket.items()}
    return metrics, weights


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_sft_step_matches_torch(tp):
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.core.worker import ParallelContext

    batch = sft_batch()
    torch_cfg = compose_config(*COMMON, *SFT)
    backend = train_backend(TorchTrainBackend, torch_cfg, ParallelContext(0, 1, torch.device("cpu")))
    _, want = backend.train_step(batch)
    want_weights = {k: v.clone() for b in backend.export_weights(to_cpu=True) for k, v in b.items()}
    cfg = compose_config(
        *COMMON,
        *SFT,
        "actor_rollout_ref.actor.strategy=megatron",
        f"{M}.param_dtype=float32",
        f"{M}.tensor_model_parallel_size={tp}",
    )
    results = run_distributed(_megatron_step, tp, cfg, batch)
    for metrics, weights in results:
        assert metrics["train/loss"] == pytest.approx(want["train/loss"], abs=1e-5)
        _assert_weights_close(weights, want_weights, atol=2e-5)
