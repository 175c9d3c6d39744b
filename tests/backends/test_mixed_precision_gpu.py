"""Mixed precision and the optimizer's CPU offload on a GPU, both train backends, and the device
memory metrics. Run on the GPU machine:

    python -m pytest -m gpu tests/backends/test_mixed_precision_gpu.py

- torch: bf16 weights move as fp32's at lr 1e-6 through the fp32 masters; the host step
  (actor.optimizer_cpu_offload, pinned transfer buffers, pageable masters, fused CPU AdamW) gives
  the resident step's weights to rounding and keeps only weights and gradients on the device.
- megatron: optimizer_cpu_offload (+ precision-aware masters on the host) runs megatron-core's
  HybridDeviceOptimizer inside the distributed optimizer and trains as the resident optimizer does.
- perf/device_memory_used_gib never exceeds the card.
"""

from __future__ import annotations

import pytest
import torch

from tests.backends.precision_check import LR, STEPS, assert_update_matches_fp32, flat_update
from tests.train_backends import train_backend

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)

A = "actor_rollout_ref.actor"


def _torch_backend(*overrides: str):
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.validate import resolve_defaults
    from dagrl.core.worker import ParallelContext
    from tests.backends.test_update_loop import SMALL
    from tests.conftest import compose_config

    cfg = compose_config(*SMALL, *LR, "trainer.device=cuda", *overrides)
    resolve_defaults(cfg)
    return train_backend(TorchTrainBackend, cfg, ParallelContext(0, 1, torch.device("cuda", 0)))


def _torch_update(*overrides: str):
    from tests.backends.test_update_loop import make_batch

    backend = _torch_backend(*overrides)
    batch = make_batch(backend)
    trained = backend.optimizer.masters
    before = [t.detach().clone() for t in trained]
    for _ in range(STEPS):
        _, metrics = backend.train_step(batch)
    return backend, flat_update(before, [t.detach() for t in trained]).cpu(), metrics


def test_torch_bf16_trains_and_the_host_step_matches():
    _, full, _ = _torch_update()
    resident, low, metrics = _torch_update("actor_rollout_ref.model.dtype=bfloat16")
    assert_update_matches_fp32(low, full)
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    assert 0 < metrics["perf/device_memory_used_gib"] <= total
    assert metrics["perf/peak_added_gib"] <= total
    host, _, _ = _torch_update("actor_rollout_ref.model.dtype=bfloat16", f"{A}.optimizer_cpu_offload=true")
    opt = host.optimizer
    assert all(m.device.type == "cpu" and not m.is_pinned() for m in opt.masters)  # never cross the bus
    assert all(t.is_pinned() for t in (*opt._grads, *opt._staging))  # the asynchronous copies'
    assert all(v.device.type == "cpu" for s in host.optimizer.state.values() for v in s.values())
    for a, b in zip(resident.model.parameters(), host.model.parameters()):
        same = (a == b).float().mean().item()  # CUDA and CPU AdamW differ in the last fp32 bits
        assert same >= 0.99


def _megatron_weights(rank, world, cfg, batch):
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext

    backend = train_backend(
        MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cuda", rank))
    )
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    old, _ = backend.forward_logprobs(batch.select(keys), "old_logprobs")
    batch = batch.union(Batch({"old_logprobs": old["old_logprobs"]}))
    for _ in range(STEPS):
        _, metrics = backend.train_step(batch)
    inner = [getattr(o, "optimizer", None) for o in getattr(backend.optimizer, "chained_optimizers", [])]
    hybrid = any(isinstance(o, HybridDeviceOptimizer) for o in inner) or isinstance(
        getattr(backend.optimizer, "optimizer", None), HybridDeviceOptimizer
    )
    weights = {k: v.clone() for b in backend.export_weights(to_cpu=True) for k, v in b.items()}
    return weights, metrics, hybrid


@pytest.fixture(scope="module")
def megatron_resident(tmp_path_factory):
    """(model, weights, metrics) of the resident optimizer's run: one for both offload cases, which
    compare against the same run (each spawned rank costs ~20-30 s of start-up)."""
    pytest.importorskip("megatron.core")
    from tests.backends.megatron.test_backend_gpu import _batch, gpu_config, qwen3_model, run_on_gpus

    model = qwen3_model(str(tmp_path_factory.mktemp("megatron") / "model"))
    [(weights, metrics, hybrid)] = run_on_gpus(_megatron_weights, 1, gpu_config(model), _batch())
    assert not hybrid
    return model, weights, metrics


@pytest.mark.parametrize("precision_aware", [False, True], ids=["masters-on-device", "masters-on-host"])
def test_megatron_cpu_optimizer_matches_the_resident_one(megatron_resident, precision_aware):
    from tests.backends.megatron.test_backend_gpu import _batch, gpu_config, run_on_gpus

    model, resident, metrics = megatron_resident
    M = f"{A}.megatron"
    offload = (f"{M}.optimizer_cpu_offload=true", f"{M}.use_precision_aware_optimizer={precision_aware}")
    [(offloaded, offload_metrics, hybrid)] = run_on_gpus(
        _megatron_weights, 1, gpu_config(model, *offload), _batch()
    )
    assert hybrid
    assert offload_metrics["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-2)
    for name, tensor in resident.items():
        same = (offloaded[name] == tensor).float().mean().item()
        assert same >= 0.99, f"{name}: {same:.2%} of the bf16 weights agree"
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    assert 0 < offload_metrics["perf/device_memory_used_gib"] <= total


def _cpu_optimizer_resume(rank, world, cfg, batch, path):
    """Step, save, step (the weights after); a second backend loads the save and steps: its weights."""
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext

    def backend():
        return train_backend(
            MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cuda", rank))
        )

    def step(b, batch):
        keys = ("prompts", "prompt_mask", "responses", "response_mask")
        old, _ = b.forward_logprobs(batch.select(keys), "old_logprobs")
        b.train_step(batch.union(Batch({"old_logprobs": old["old_logprobs"]})))
        return {k: v.clone() for bucket in b.export_weights(to_cpu=True) for k, v in bucket.items()}

    first = backend()
    step(first, batch)
    first.save(path)
    straight = step(first, batch)
    del first
    second = backend()
    second.load(path)
    return straight, step(second, batch)


def test_megatron_cpu_optimizer_resumes_exactly(tmp_path):
    """optimizer_cpu_offload (HybridDeviceOptimizer, masters on the host): a checkpoint of step 1
    loads into a fresh backend whose step 2 gives the uninterrupted run's weights bit for bit."""
    pytest.importorskip("megatron.core")
    from tests.backends.megatron.test_backend_gpu import _batch, gpu_config, qwen3_model, run_on_gpus

    model = qwen3_model(str(tmp_path / "model"))
    offload = (f"{A}.megatron.optimizer_cpu_offload=true", f"{A}.megatron.use_distributed_optimizer=true")
    [(straight, resumed)] = run_on_gpus(
        _cpu_optimizer_resume, 1, gpu_config(model, *offload), _batch(), str(tmp_path / "ckpt")
    )
    assert straight.keys() == resumed.keys()
    for name, tensor in straight.items():
        if not torch.equal(resumed[name], tensor):
            diff = (resumed[name].float() - tensor.float()).abs()
            pytest.fail(
                f"{name}: {(diff > 0).float().mean():.2%} of the weights differ, by up to {diff.max():.3g}"
            )
