"""megatron's CPU optimizer (optimizer_cpu_offload: megatron-core's HybridDeviceOptimizer) against
the optimizer on the device, on one GPU. Run on the GPU machine:

    python -m pytest -m gpu tests/backends/megatron/test_optimizer_gpu.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)

from tests.backends.megatron.test_backend_gpu import M, _batch, gpu_config, qwen3_model, run_on_gpus  # noqa: E402
from tests.train_backends import train_backend  # noqa: E402


def _updates(rank, world, cfg, batch, steps=3):
    """`steps` updates on one batch (advantages fixed, old log-probs the model's own): the grad norm
    of each and the log-probs after the last."""
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext

    backend = train_backend(
        MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cuda", rank))
    )
    old, _ = backend.forward_logprobs(batch, "ref_logprobs")
    advantages = torch.randn(old["ref_logprobs"].shape, generator=torch.Generator().manual_seed(0))
    extra = Batch({"old_logprobs": old["ref_logprobs"], "advantages": advantages * batch["response_mask"]})
    train = batch.select(("prompts", "prompt_mask", "responses", "response_mask")).union(extra)
    norms = [backend.train_step(train)[1]["actor/grad_norm"] for _ in range(steps)]
    after, _ = backend.forward_logprobs(batch, "ref_logprobs")
    return {
        "grad_norms": norms,
        "logprobs": after["ref_logprobs"],
        "moved": after["ref_logprobs"] - old["ref_logprobs"],
    }


LR = "actor_rollout_ref.actor.optim.lr=1e-4"  # bf16 weights move in three steps


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The model, the batch and the device optimizer's three updates: made once for both shares."""
    model = qwen3_model(str(tmp_path_factory.mktemp("optimizer") / "m"))
    batch = _batch()
    device = run_on_gpus(_updates, 1, gpu_config(model, LR, f"{M}.optimizer_cpu_offload=false"), batch)[0]
    return model, batch, device


@pytest.mark.parametrize("fraction", [1.0, 0.6])
def test_the_host_optimizer_trains_as_the_device_optimizer(reference, fraction):
    """optimizer_cpu_offload (megatron-core's HybridDeviceOptimizer), all of the state on the host or
    a share of it (the plan's auto choice on a host that cannot hold it all: 0.6 for the 8B on one
    H200 machine), against the optimizer on the device: the same grad norms step by step and the same
    log-probs after three updates, within bf16."""
    model, batch, device = reference
    flags = [LR, f"{M}.optimizer_cpu_offload=true", f"{M}.optimizer_offload_fraction={fraction}"]
    host = run_on_gpus(_updates, 1, gpu_config(model, *flags), batch)[0]
    mask = batch["response_mask"].bool()
    moved = device["moved"].abs()[mask].mean()
    assert moved > 1e-3, moved  # the updates changed the model: the comparison below means something
    assert host["grad_norms"] == pytest.approx(device["grad_norms"], rel=0.02), (
        host["grad_norms"],
        device["grad_norms"],
    )
    diff = (host["logprobs"] - device["logprobs"]).abs()[mask]
    assert diff.mean() < 0.05 * moved and diff.max() < 0.25, (diff.mean(), diff.max(), moved)
