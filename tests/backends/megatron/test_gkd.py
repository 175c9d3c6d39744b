"""GKD on the megatron backend: a forward-only megatron teacher (top-k and final hidden states) and
one student update per mode (top-k 5 with the tail bucket, and the full vocabulary), under TP1,
TP2, TP2 with sequence parallel and PP2, against the torch backend on the same shipped tiny student and
teacher: teacher outputs, divergence, gradient norm and updated weights agree to fp32 rounding, so
TP2 equals TP1. The teacher's offload (teacher.offload=true) empties every parameter's storage
and restores it exactly. Everything runs megatron-core's real code on CPU under gloo
(tests/megatron_cpu_patch.py)."""

from __future__ import annotations

import pytest
import torch

from dagrl.config.validate import resolve_defaults
from dagrl.core.batch import Batch
from tests.backends.megatron.test_backend import COMMON, INPUT_KEYS, M, make_batch
from tests.conftest import compose_config
from tests.megatron_cpu_patch import run_distributed
from tests.train_backends import train_backend

pytest.importorskip("megatron.core")

G = "algorithm.gkd"
K = 5
MODES = {
    "topk": (f"{G}.gkd_logits_topk={K}", f"{G}.tail_bucket=true"),
    "full": (),  # gkd_logits_topk unset: the full vocabulary
}
COMMON_GKD = ("algorithm=gkd", *COMMON, f"{G}.temperature=1.5", f"{G}.beta=0.3")


def gkd_config(mode: str, *overrides: str):
    cfg = compose_config(*COMMON_GKD, *MODES[mode], *overrides)
    resolve_defaults(cfg)  # fills teacher.model (the shipped teacher) and ref.megatron from the actor
    return cfg


def _teacher_outputs(teacher, batch: Batch, mode: str):
    if mode == "topk":
        return teacher.teacher_topk(batch, k=K, temperature=1.5)[0]
    return teacher.teacher_hidden(batch)[0]


def _weights(backend) -> dict:
    return {k: v.clone() for bucket in backend.export_weights(to_cpu=True) for k, v in bucket.items()}


def _torch_reference(batch: Batch) -> dict:
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import ParallelContext

    ctx = ParallelContext(0, 1, torch.device("cpu"))
    out = {}
    for mode in MODES:
        cfg = gkd_config(mode)
        spec = role_spec(cfg, "teacher")
        teacher = train_backend(TorchTrainBackend, cfg, ctx, spec)
        student = train_backend(TorchTrainBackend, cfg, ctx)
        scored = _teacher_outputs(teacher, batch, mode)
        _, metrics = student.train_step(batch.union(scored))
        out[mode] = {"teacher": scored, "metrics": metrics, "weights": _weights(student)}
    return out


def _gkd_rank(rank: int, world: int, overrides: tuple[str, ...], batch: Batch) -> dict:
    """Per mode: the megatron teacher scores the batch, a fresh megatron student takes one step."""
    import dagrl.algos.distillation as distillation
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import ParallelContext

    distillation._CHUNK_ELEMENTS = 1000  # 3-7 tokens per chunk: collectives inside chunks, in the schedule
    ctx = ParallelContext(rank, world, torch.device("cpu"))
    out = {}
    for mode in MODES:
        megatron = ("actor_rollout_ref.actor.strategy=megatron", f"{M}.param_dtype=float32")
        cfg = gkd_config(mode, *megatron, "teacher.offload=true", *overrides)
        spec = role_spec(cfg, "teacher")
        teacher = train_backend(MegatronTrainBackend, cfg, ctx, spec)
        student = train_backend(MegatronTrainBackend, cfg, ctx)
        returns = student.dp_info()[2]
        scored = _teacher_outputs(teacher, batch, mode)
        _, metrics = student.train_step(batch.union(scored))
        out[mode] = {
            "teacher": scored if returns else None,
            "metrics": metrics if returns else None,
            "weights": _weights(student),
        }
        # teacher.offload: every parameter's storage leaves, and the teacher scores the same after
        offloaded = teacher.offload()
        left = sum(p.data.untyped_storage().nbytes() for p in teacher._params())
        teacher.onload()
        again = _teacher_outputs(teacher, batch, mode)
        same = all(torch.equal(again[k], scored[k]) for k in scored.keys())
        out[mode]["offload"] = (offloaded, left, same)
    return out


@pytest.fixture(scope="module")
def case():
    batch = make_batch().select(INPUT_KEYS)
    return batch, _torch_reference(batch)


def _check(mode: str, got: dict, want: dict, mask: torch.Tensor) -> None:
    if mode == "topk":
        cells = mask.bool()
        assert torch.equal(
            got["teacher"]["teacher_topk_ids"][cells], want["teacher"]["teacher_topk_ids"][cells]
        )
        torch.testing.assert_close(
            got["teacher"]["teacher_topk_logprobs"][cells], want["teacher"]["teacher_topk_logprobs"][cells],
            rtol=0, atol=2e-5,
        )  # fmt: skip
    else:
        hidden, ref = got["teacher"]["teacher_hidden"], want["teacher"]["teacher_hidden"]
        assert hidden.shape == ref.shape == (*mask.shape, 128)
        torch.testing.assert_close(hidden * mask[..., None], ref * mask[..., None], rtol=0, atol=2e-5)
    div, ref_div = got["metrics"]["distill/divergence"], want["metrics"]["distill/divergence"]
    assert ref_div > 1e-3 and div == pytest.approx(ref_div, rel=1e-4)
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(want["metrics"]["actor/grad_norm"], rel=1e-4)
    _check_weights_only(got["weights"], want["weights"])


def _check_weights_only(got: dict, want: dict) -> None:
    """The export gives every rank every HF weight (a collective over TP/PP): the torch student's
    names less the tied output layer (the tiny model ties lm_head to its embedding, and megatron's
    export drops it as HF does), each equal to its value."""
    names = want.keys() - {"lm_head.weight"}
    assert got.keys() == names, sorted(got.keys() ^ names)
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    "world, overrides",
    [
        (1, ()),
        (2, (f"{M}.tensor_model_parallel_size=2",)),
        (2, (f"{M}.tensor_model_parallel_size=2", f"{M}.sequence_parallel=true")),
        (2, (f"{M}.pipeline_model_parallel_size=2",)),
    ],
    ids=["tp1", "tp2", "tp2-sp", "pp2"],
)
def test_megatron_gkd_matches_torch_backend(case, world, overrides):
    """TP2's 262-column padded vocabulary (131 per rank): top-k merged over both shards (that the
    merge draws from both is tests/backends/megatron/test_distillation.py's), the full divergence
    summed over them, the teacher's head rows read per shard from its checkpoint."""
    batch, reference = case
    ranks = run_distributed(_gkd_rank, world, overrides, batch)
    for mode in MODES:
        kept = [r[mode] for r in ranks if r[mode]["metrics"] is not None]
        assert kept
        for r in kept:
            _check(mode, r, reference[mode], batch["response_mask"])
        for r in ranks:  # every rank exports the whole model, equal to the torch student
            _check_weights_only(r[mode]["weights"], reference[mode]["weights"])
            assert r[mode]["offload"] == (True, 0, True)
