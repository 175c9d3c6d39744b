"""Colocated turns on one GPU with the torch backend: a worker hosting the actor and a GKD teacher
hands the device from one to the other, and each offload frees what the role holds (the actor's
weights and Adam state, the teacher's weights), reported as metrics. Run on the GPU machine:

    python -m pytest -m gpu tests/backends/torch/test_offload_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from dagrl.backends import build_backend
from dagrl.config.role_specs import build_role_specs
from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.worker import Worker
from dagrl.trainer.setup import worker_parts
from tests.backends.torch.test_full_vocab import batch, save_tiny_qwen2
from tests.conftest import compose_config

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)


def worker(tmp_path, *overrides) -> Worker:
    student = save_tiny_qwen2(tmp_path / "student", 0, 256, tie=True)
    teacher = save_tiny_qwen2(tmp_path / "teacher", 1, 512, tie=False)
    cfg = compose_config(
        "algorithm=gkd",
        "algorithm.gkd.gkd_logits_topk=8",
        f"actor_rollout_ref.model.path={student}",
        f"teacher.model={teacher}",
        "trainer.device=cuda",
        *overrides,
    )
    resolve_defaults(cfg)
    validate(cfg)
    parts = worker_parts(cfg, build_role_specs(cfg, ["train", "teacher"]))
    w = Worker(parts, ["train", "teacher"], 0, 1, "cuda", threads=1, build=build_backend)
    w.setup("127.0.0.1", 0)
    return w


def gib(module: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in module.parameters()) / 2**30


def on_gpu(module: torch.nn.Module) -> bool:
    """Whether the parameters hold GPU memory (offload keeps them as objects, frees their storage)."""
    p = next(module.parameters())
    return p.is_cuda and p.untyped_storage().nbytes() > 0


@pytest.mark.parametrize("offload", [True, False])
def test_colocated_turns_free_what_each_role_holds(tmp_path, offload):
    flag = str(offload).lower()
    w = worker(tmp_path, f"actor_rollout_ref.actor.offload={flag}", f"teacher.offload={flag}")
    actor, teacher = w.backends["train"], w.backends["teacher"]
    b = batch()
    w.activate("train")  # roles hand the device over as they are built: the actor takes it back
    snapshot = [p.detach().clone() for p in actor.model.parameters()]
    assert on_gpu(actor.model)
    assert on_gpu(teacher.model) is not offload
    assert teacher.offload_freed_gib >= (0.99 * gib(teacher.model) if offload else 0)
    freed = teacher.offload_freed_gib
    w.release_others("train")  # offloaded again (the weight sync does this): the figure stays
    assert teacher.offload_freed_gib == freed
    _, first = w.call("teacher", "teacher_topk", b, 8, 1.0)  # the actor leaves, the teacher scores
    assert first["timing_s/teacher_forward"] > 0
    assert on_gpu(actor.model) is not offload
    assert actor.offload_freed_gib >= (0.99 * gib(actor.model) if offload else 0)
    # the metric the step line shows: what the teacher's last offload freed
    assert first["teacher/offload_freed_gib"] == pytest.approx(teacher.offload_freed_gib)
    assert (first["teacher/offload_freed_gib"] > 0) is offload
    # the teacher's pass, as every phase: its peak, the device in use at its end, its calls to the driver
    assert first["teacher/peak_added_gib"] > 0 and first["teacher/device_memory_used_gib"] > 0
    assert {"teacher/alloc_retries", "teacher/device_mallocs", "teacher/device_frees"} <= set(first)
    w.activate("train")  # back from host memory bit for bit
    assert all(torch.equal(s, p) for s, p in zip(snapshot, actor.model.parameters()))
    w.shutdown()
