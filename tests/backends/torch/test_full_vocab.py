"""Full-vocabulary GKD on the torch backend beyond the old 4096-word limit: tiny 6000-word student
and teacher built in code, teacher_hidden + the student's chunked divergence (several chunks)
against the unchunked math on both models' full logits, loss and every parameter's gradient."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import dagrl.algos.distillation as distillation
from dagrl.algos import LossAggMode, agg_loss
from dagrl.algos.distillation import divergence_from_logits
from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.batch import Batch, left_pad, sequence_inputs
from dagrl.core.worker import ParallelContext
from dagrl.objectives import build_objective
from tests.conftest import compose_config
from tests.train_backends import train_backend

VOCAB = 6000
G = "algorithm.gkd"


def save_tiny_qwen2(path, seed: int, hidden: int, tie: bool) -> str:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=tie,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # spread logits so the distributions differ visibly
        model.get_output_embeddings().weight.mul_(20)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("full_vocab")
    student = save_tiny_qwen2(root / "student", 0, 16, tie=True)
    teacher = save_tiny_qwen2(root / "teacher", 1, 24, tie=False)  # another width: H' != H
    return student, teacher


def batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    prompts, prompt_mask = left_pad(
        [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 3, 6)], 0
    )
    responses = torch.randint(3, VOCAB, (3, 4), generator=g)
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    return Batch(
        {
            "prompts": prompts,
            "prompt_mask": prompt_mask,
            "responses": responses,
            "response_mask": response_mask,
        }
    )


def response_logits(model, b: Batch) -> torch.Tensor:
    ids, attn, pos = sequence_inputs(b["prompts"], b["prompt_mask"], b["responses"], b["response_mask"])
    r = b["responses"].shape[1]
    return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -r - 1 : -1]


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_full_vocab_gkd_equals_unchunked_reference(models, beta, monkeypatch):
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.role_specs import build_role_specs

    student_path, teacher_path = models
    cfg = compose_config(
        "algorithm=gkd",
        f"actor_rollout_ref.model.path={student_path}",
        f"teacher.model={teacher_path}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"{G}.beta={beta}",
        f"{G}.temperature=1.5",
        "teacher.log_prob_micro_batch_size_per_gpu=2",
    )
    resolve_defaults(cfg)
    validate(cfg)  # 6000 words > the old 4096 limit: accepted
    monkeypatch.setattr(distillation, "_CHUNK_ELEMENTS", 3 * VOCAB)  # 3 tokens per chunk: 4 chunks
    ctx = ParallelContext(0, 1, torch.device("cpu"))
    spec = build_role_specs(cfg, {"train", "teacher"})["teacher"]
    teacher = train_backend(TorchTrainBackend, cfg, ctx, spec)
    student = train_backend(TorchTrainBackend, cfg, ctx)
    b = batch()
    out, metrics = teacher.teacher_hidden(b)
    assert out["teacher_hidden"].shape == (3, 4, 24) and metrics["timing_s/teacher_forward"] > 0
    b = Batch({**b.tensors, "teacher_hidden": out["teacher_hidden"]})

    objective = build_objective(cfg)
    assert objective.required_keys == ("response_mask", "teacher_hidden")
    tokens = student._token_outputs(student.model, b, objective.request)
    loss, metrics = objective.loss(b, tokens)
    params = list(student.model.parameters())
    grads = torch.autograd.grad(loss, params)

    mask = b["response_mask"].float()
    with torch.no_grad():
        t_logits = response_logits(teacher.model, b)
    s_logits = response_logits(student.model, b)
    per_token = divergence_from_logits(s_logits, t_logits, beta, 1.5) * mask
    expected = agg_loss(per_token, mask, LossAggMode(cfg.actor_rollout_ref.actor.loss_agg_mode))
    expected_grads = torch.autograd.grad(expected, params)
    assert float(expected.detach()) > 1e-3
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tokens.divergence.detach(), per_token.detach(), rtol=1e-5, atol=1e-6)
    assert float(metrics["distill/divergence"]) == pytest.approx(float(expected.detach()), rel=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_teacher_offload_flag_reaches_the_teacher_backend(models):
    from dagrl.config.role_specs import build_role_specs

    _, teacher_path = models
    cfg = compose_config("algorithm=gkd", f"teacher.model={teacher_path}", "teacher.offload=true")
    assert build_role_specs(cfg, {"train", "teacher"})["teacher"].offload.params
