"""algorithm=gkd: its config rules, the teacher's top-k from the torch backend against the teacher's
own logits, and the gkd objective's loss and gradient against dagrl/algos/distillation.py."""

from __future__ import annotations

import json

import pytest
import torch

from dagrl.algos import LossAggMode, agg_loss
from dagrl.algos.distillation import full_vocab_divergence, topk_divergence
from dagrl.config.keys import schema_keys
from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.batch import Batch, left_pad, sequence_inputs
from dagrl.core.worker import ParallelContext
from dagrl.data.builtin import tiny_model_path, tiny_teacher_path
from dagrl.errors import ConfigError
from dagrl.objectives import build_objective
from tests.conftest import compose_config
from tests.train_backends import train_backend

G = "algorithm.gkd"


def gkd_config(*overrides: str):
    cfg = compose_config("algorithm=gkd", *overrides)
    resolve_defaults(cfg)
    return cfg


def test_default_gkd_job_distils_the_shipped_student_from_the_shipped_teacher():
    cfg = gkd_config()
    validate(cfg)
    assert cfg.teacher.model == tiny_teacher_path()
    assert cfg.actor_rollout_ref.model.path is None  # the shipped tiny_arith
    assert cfg.algorithm.gkd.gkd_logits_topk is None and cfg.algorithm.gkd.beta == 0.5


def _vocab_dir(tmp_path, vocab: int) -> str:
    path = tmp_path / f"model_{vocab}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    return str(path)


@pytest.mark.parametrize(
    "overrides, key",
    [
        ([f"{G}.lmbda=1.5"], f"{G}.lmbda"),
        ([f"{G}.sft_alpha=0.1"], f"{G}.sft_alpha"),  # lmbda 1: no off-policy step to apply it on
        ([f"{G}.sft_alpha=-0.1", f"{G}.lmbda=0.5"], f"{G}.sft_alpha"),
        (["teacher.model=self_current", "teacher.offload=true"], "teacher.offload"),
        (["teacher.model=self_current"], f"{G}.gkd_logits_topk"),  # full vocabulary reads a checkpoint
        ([f"{G}.beta=1.5"], f"{G}.beta"),
        ([f"{G}.temperature=0"], f"{G}.temperature"),
        ([f"{G}.gkd_logits_topk=262"], f"{G}.gkd_logits_topk"),
        ([f"{G}.gkd_logits_topk=0"], f"{G}.gkd_logits_topk"),
        (
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
            ],
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size",
        ),
        # a model path set: the shipped teacher is not filled in
        (
            [f"actor_rollout_ref.model.path={tiny_model_path()}", "actor_rollout_ref.actor.optim.lr=1e-4"],
            "teacher.model",
        ),
    ],
)
def test_each_refusal_names_its_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(gkd_config(*overrides))
    assert err.value.key == key


def test_teacher_vocabulary_must_equal_the_students(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(gkd_config(f"teacher.model={_vocab_dir(tmp_path, 300)}"))
    assert err.value.key == "teacher.model" and "300" in str(err.value) and "261" in str(err.value)


def test_full_vocabulary_has_no_size_limit_and_runs_the_teacher_hidden_node(tmp_path):
    """Full vocabulary goes through teacher_hidden ([B, R, H']) whatever the vocabulary size;
    top-k through teacher_logprob. One DAG serves both."""
    from dagrl.core.dag import load_dag_specs, prune_disabled

    big = _vocab_dir(tmp_path, 151_936)
    cfg = gkd_config(
        f"actor_rollout_ref.model.path={big}", f"teacher.model={big}", "actor_rollout_ref.actor.optim.lr=1e-6"
    )
    validate(cfg)
    _, specs = load_dag_specs("gkd")
    kinds = {s.kind: s for s in prune_disabled(specs, cfg)}
    assert "teacher_hidden" in kinds and "teacher_logprob" not in kinds
    assert "teacher_hidden" in kinds["actor_update"].inputs
    assert "teacher_topk_ids" not in kinds["actor_update"].inputs
    cfg = gkd_config(f"{G}.gkd_logits_topk=64")
    kinds = {s.kind: s for s in prune_disabled(specs, cfg)}
    assert "teacher_logprob" in kinds and "teacher_hidden" not in kinds
    doc = schema_keys()[f"{G}.gkd_logits_topk"].doc  # --help says so too
    assert "of any size" in doc and "small" not in doc
    assert "teacher_hidden" not in kinds["actor_update"].inputs


# ---- the torch backend: teacher top-k and the gkd objective -------------------------------------
def _batch(tokenizer_pad: int = 0) -> Batch:
    """4 rows of ragged prompts and responses from the tiny vocabulary (ids < 261)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 261, (n,), generator=g).tolist() for n in (5, 3, 6, 4)]
    ids, mask = left_pad(prompts, tokenizer_pad)
    responses = torch.randint(3, 261, (4, 3), generator=g)
    response_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    return Batch(
        {"prompts": ids, "prompt_mask": mask, "responses": responses, "response_mask": response_mask}
    )


def _backend(cfg, forward_only: bool):
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.role_specs import build_role_specs

    ctx = ParallelContext(0, 1, torch.device("cpu"))
    if not forward_only:
        return train_backend(TorchTrainBackend, cfg, ctx)
    spec = build_role_specs(cfg, {"train", "teacher"})["teacher"]
    return train_backend(TorchTrainBackend, cfg, ctx, spec)


def _response_logits(model, batch: Batch) -> torch.Tensor:
    ids, attn, pos = sequence_inputs(
        batch["prompts"], batch["prompt_mask"], batch["responses"], batch["response_mask"]
    )
    r = batch["responses"].shape[1]
    return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -r - 1 : -1].float()


def test_teacher_topk_matches_the_teachers_own_logits():
    cfg = gkd_config(f"{G}.temperature=2.0", "teacher.log_prob_micro_batch_size_per_gpu=3")  # 2 chunks
    teacher = _backend(cfg, forward_only=True)
    batch = _batch()
    out, _ = teacher.teacher_topk(batch, k=5, temperature=2.0)
    with torch.no_grad():
        reference = torch.log_softmax(_response_logits(teacher.model, batch) / 2.0, -1)
    mask = batch["response_mask"].bool()
    top = reference.topk(5, -1)
    assert out["teacher_topk_ids"].shape == (4, 3, 5)
    torch.testing.assert_close(out["teacher_topk_logprobs"][mask], top.values[mask], rtol=1e-5, atol=1e-5)
    got = reference.gather(-1, out["teacher_topk_ids"])  # same log-probs at the returned ids
    torch.testing.assert_close(got[mask], top.values[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tail_bucket", [False, True])
@pytest.mark.parametrize("k", [8, 261])
def test_gkd_loss_and_gradient_equal_the_distillation_math(k, tail_bucket):
    cfg = gkd_config(
        f"{G}.gkd_logits_topk={k}", f"{G}.tail_bucket={str(tail_bucket).lower()}", f"{G}.temperature=1.5"
    )
    student, teacher = _backend(cfg, forward_only=False), _backend(cfg, forward_only=True)
    batch = _batch()
    top, _ = teacher.teacher_topk(batch, k=k, temperature=1.5)
    batch = Batch({**{key: batch[key] for key in batch.keys()}, **{key: top[key] for key in top.keys()}})
    objective = build_objective(cfg)

    out = student._token_outputs(student.model, batch, objective.request)
    loss, metrics = objective.loss(batch, out)
    grads = torch.autograd.grad(loss, list(student.model.parameters()))

    logits = _response_logits(student.model, batch)
    mask = batch["response_mask"].float()
    s = torch.log_softmax(logits / 1.5, -1).gather(-1, batch["teacher_topk_ids"])
    per_token = topk_divergence(s, batch["teacher_topk_logprobs"], mask, 0.5, tail_bucket)
    expected = agg_loss(per_token, mask, LossAggMode(cfg.actor_rollout_ref.actor.loss_agg_mode))
    expected_grads = torch.autograd.grad(expected, list(student.model.parameters()))
    torch.testing.assert_close(loss, expected)
    assert float(metrics["distill/divergence"]) == pytest.approx(float(expected.detach()))
    assert loss > 0
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    if k == 261:  # K = V is the full-vocabulary divergence
        with torch.no_grad():
            t_logits = _response_logits(teacher.model, batch)
            full = full_vocab_divergence(logits.detach(), t_logits, mask, 0.5, 1.5)
        torch.testing.assert_close(per_token.detach(), full, rtol=1e-4, atol=1e-6)
