"""A train backend builds what its role's spec says: a colocated teacher is the torch backend,
forward-only, with the teacher's model and the teacher's log-prob micro-batch (not the actor's
model copied into a deep copy of the config, not the reference's micro-batch)."""

from __future__ import annotations

import torch

from dagrl.backends import build_backend
from dagrl.backends.hf_model import resolve_model_path
from dagrl.config.role_specs import role_spec
from dagrl.config.validate import resolve_defaults
from dagrl.core.batch import Batch
from dagrl.core.worker import ParallelContext
from tests.conftest import compose_config

CTX = ParallelContext(0, 1, torch.device("cpu"))


def _batch(rows: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        {
            "prompts": torch.randint(3, 60, (rows, 4), generator=g),
            "prompt_mask": torch.ones(rows, 4, dtype=torch.long),
            "responses": torch.randint(3, 60, (rows, 3), generator=g),
            "response_mask": torch.ones(rows, 3, dtype=torch.long),
        }
    )


def test_teacher_backend_uses_its_own_model_and_micro_batch():
    cfg = compose_config(
        "algorithm=gkd",
        "actor_rollout_ref.model.use_remove_padding=false",  # one model call per micro-batch
        "teacher.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
    )
    resolve_defaults(cfg)
    spec = role_spec(cfg, "teacher")
    teacher = build_backend(spec, CTX)
    assert teacher.forward_only and teacher.path == resolve_model_path(cfg.teacher.model)
    assert teacher.path != resolve_model_path(cfg.actor_rollout_ref.model.path)
    assert cfg.actor_rollout_ref.model.path is None  # the config itself is left as it was
    calls = []
    teacher.model.register_forward_hook(lambda module, args, out: calls.append(1))
    out, _ = teacher.forward_logprobs(_batch(6), "teacher_logprobs")  # distill_reward's pass
    assert out["teacher_logprobs"].shape == (6, 3)
    assert len(calls) == 3  # 6 rows in the teacher's micro-batches of 2 (the ref's 64 made it 1)
