"""Multi-turn rows under every objective: the teacher (torch, and the vLLM request builder) reads
the whole episode, observations included; the losses — GKD top-k and full vocabulary, OPSD, GRPO
with its rollout-vs-trainer mismatch metrics — count only the policy's tokens (response_mask):
whatever the teacher, the rollout or the student says at an observation or padding token changes
neither loss, metrics nor gradient."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from dagrl.config.validate import resolve_defaults
from dagrl.core.batch import Batch, left_pad, sequence_inputs
from dagrl.nodes.teacher import with_teacher_prompts
from dagrl.objectives import TokenOutputs, build_objective
from tests.conftest import compose_config
from tests.objectives.test_gkd import _backend, gkd_config

G = "algorithm.gkd"
# per row: (kind, length) segments of the response; p = the policy's tokens, o = an observation
EPISODES = [[("p", 3), ("o", 3), ("p", 2)], [("p", 2), ("o", 2), ("p", 3), ("o", 1), ("p", 1)]]
WIDTH = 10


def episode_batch(seed: int = 0) -> Batch:
    """Two multi-turn rows: response_mask on the policy's tokens, response_attention_mask on all."""
    g = torch.Generator().manual_seed(seed)
    prompts, prompt_mask = left_pad([torch.randint(5, 261, (n,), generator=g).tolist() for n in (4, 2)], 0)
    responses = torch.zeros((2, WIDTH), dtype=torch.long)
    policy = torch.zeros((2, WIDTH), dtype=torch.long)
    attention = torch.zeros((2, WIDTH), dtype=torch.long)
    for row, segments in enumerate(EPISODES):
        col = 0
        for kind, n in segments:
            responses[row, col : col + n] = torch.randint(5, 261, (n,), generator=g)
            policy[row, col : col + n] = int(kind == "p")
            col += n
        attention[row, :col] = 1
    return Batch(
        {
            "prompts": prompts,
            "prompt_mask": prompt_mask,
            "responses": responses,
            "response_mask": policy,
            "response_attention_mask": attention,
        }
    )


def off_policy_cells(batch: Batch) -> torch.Tensor:
    """[B, R] bool: observation and padding cells (what the losses must ignore)."""
    return ~batch["response_mask"].bool()


def episode_logits(model, batch: Batch) -> torch.Tensor:
    """The model's logits predicting each response token, the whole episode attended."""
    ids, attn, pos = sequence_inputs(
        batch["prompts"], batch["prompt_mask"], batch["responses"], batch["response_attention_mask"]
    )
    r = batch["responses"].shape[1]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -r - 1 : -1].float()


def test_teacher_reads_the_observations_and_opsd_keeps_the_episode():
    cfg = gkd_config(f"{G}.gkd_logits_topk=6")
    teacher = _backend(cfg, forward_only=True)
    batch = episode_batch()
    out, _ = teacher.teacher_topk(with_teacher_prompts(batch), k=6, temperature=1.0)
    policy = batch["response_mask"].bool()
    top = torch.log_softmax(episode_logits(teacher.model, batch), -1).topk(6, -1)
    torch.testing.assert_close(out["teacher_topk_logprobs"][policy], top.values[policy], rtol=1e-5, atol=1e-5)
    # what a teacher blind to the observations would say differs after the first observation
    blind, _ = teacher.teacher_topk(
        batch.select(["prompts", "prompt_mask", "responses", "response_mask"]), 6, 1.0
    )
    assert not torch.allclose(blind["teacher_topk_logprobs"][0, 6:8], out["teacher_topk_logprobs"][0, 6:8])

    # OPSD: the privileged prompt replaces the prompt; the multi-turn response stays as it is
    privileged = left_pad([[7, 8, 9, 10, 11, 12], [13, 14, 15]], 0)
    opsd = batch.union(Batch(dict(zip(("teacher_prompts", "teacher_prompt_mask"), privileged))))
    view = with_teacher_prompts(opsd)
    assert torch.equal(view["prompts"], privileged[0])
    assert torch.equal(view["response_attention_mask"], batch["response_attention_mask"])
    assert torch.equal(view["response_mask"], batch["response_mask"])


@pytest.mark.parametrize("k", [8, None], ids=["topk", "full_vocab"])
def test_gkd_loss_ignores_what_the_teacher_says_at_observations(k):
    """Perturbing the teacher's outputs (top-k ids and log-probs, or hidden states) at observation
    and padding cells leaves loss and gradient bit-identical; at a policy token it changes them."""
    topk = f"{G}.gkd_logits_topk={k}" if k else f"{G}.gkd_logits_topk=null"
    cfg = gkd_config(topk, f"{G}.temperature=1.5")
    student, teacher = _backend(cfg, forward_only=False), _backend(cfg, forward_only=True)
    batch = episode_batch()
    view = with_teacher_prompts(batch)
    scored, _ = teacher.teacher_topk(view, k=k, temperature=1.5) if k else teacher.teacher_hidden(view)
    objective = build_objective(cfg)
    cells = off_policy_cells(batch)
    g = torch.Generator().manual_seed(3)

    def loss_and_grads(teacher_out: dict):
        mb = Batch({**batch.tensors, **teacher_out})
        out = student._token_outputs(student.model, mb, objective.request)
        loss, _ = objective.loss(mb, out)
        return loss, torch.autograd.grad(loss, list(student.model.parameters()))

    def perturbed(where: torch.Tensor) -> dict:
        out = {key: scored[key].clone() for key in scored.keys()}
        if k:
            noise = torch.log_softmax(torch.randn(*out["teacher_topk_logprobs"].shape, generator=g) * 3, -1)
            out["teacher_topk_logprobs"][where] = noise[where]
            out["teacher_topk_ids"][where] = torch.randint(
                0, 261, out["teacher_topk_ids"].shape, generator=g
            )[where]
        else:
            out["teacher_hidden"][where] += 5 * torch.randn(*out["teacher_hidden"].shape, generator=g)[where]
        return out

    loss, grads = loss_and_grads({key: scored[key] for key in scored.keys()})
    masked_loss, masked_grads = loss_and_grads(perturbed(cells))
    assert loss > 0 and torch.equal(loss, masked_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, masked_grads))
    policy_loss, _ = loss_and_grads(perturbed(~cells))
    assert not torch.equal(loss, policy_loss)


def test_grpo_loss_and_mismatch_metrics_ignore_observations():
    """GRPO with rollout correction (IS + rejection): the student's own log-probs, the old and the
    rollout log-probs and the advantages at observation cells change no loss or metric."""
    cfg = compose_config(
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token"
    )
    resolve_defaults(cfg)
    objective = build_objective(cfg)
    batch = episode_batch()
    cells = off_policy_cells(batch)
    g = torch.Generator().manual_seed(5)
    shape = batch["responses"].shape
    base = {
        "old_logprobs": -torch.rand(shape, generator=g),
        "rollout_logprobs": -torch.rand(shape, generator=g),
        "advantages": torch.randn(shape, generator=g),
        "logprobs": -torch.rand(shape, generator=g),
        "entropy": torch.rand(shape, generator=g),
    }

    def loss_and_metrics(values: dict):
        logprobs = values["logprobs"].clone().requires_grad_(True)
        keys = ("old_logprobs", "rollout_logprobs", "advantages")
        mb = Batch({**batch.tensors, **{key: values[key] for key in keys}})
        loss, metrics = objective.loss(mb, TokenOutputs(logprobs=logprobs, entropy=values["entropy"]))
        (grad,) = torch.autograd.grad(loss, logprobs)
        return loss, {key: float(v) for key, v in metrics.items()}, grad

    noisy = {
        key: torch.where(cells, value - 10 * torch.rand(shape, generator=g), value)
        for key, value in base.items()
    }
    loss, metrics, grad = loss_and_metrics(base)
    masked_loss, masked_metrics, masked_grad = loss_and_metrics(noisy)
    assert {"rollout_corr/logprob_abs_diff_max", "rollout_corr/rs_rejected_frac_mean"} <= metrics.keys()
    assert torch.equal(loss, masked_loss) and metrics == masked_metrics
    assert torch.equal(grad, masked_grad) and not grad[cells].any()


def test_standalone_teacher_requests_hold_the_whole_episode(monkeypatch):
    """The vLLM teacher asks for the prompt log-probs of prompt + every real response token, and
    lands them on the [B, R] grid: observations are scored as the tokens they are."""
    from dagrl.backends.vllm.teacher import VLLMTeacherBackend

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))
    monkeypatch.setitem(
        sys.modules, "vllm.inputs", SimpleNamespace(TokensPrompt=lambda prompt_token_ids: prompt_token_ids)
    )
    requests = []

    def generate(prompts, params, use_tqdm):  # entry i: the actual token i at rank 1 (k=1)
        requests.extend(prompts)
        lp = SimpleNamespace
        return [
            SimpleNamespace(prompt_logprobs=[None] + [{t: lp(logprob=-0.5, rank=1)} for t in ids[1:]])
            for ids in prompts
        ]

    backend = object.__new__(VLLMTeacherBackend)
    backend.llm, backend.base_scale = SimpleNamespace(generate=generate), None
    batch = episode_batch()
    out, _ = backend.teacher_topk(batch, k=1, temperature=1.0)
    attention = batch["response_attention_mask"].bool()
    for row in range(2):
        prompt = batch["prompts"][row][batch["prompt_mask"][row].bool()].tolist()
        assert requests[row] == prompt + batch["responses"][row][attention[row]].tolist()
    # the teacher's "top-1" at every real response cell is the token there, observations included
    assert torch.equal(out["teacher_topk_ids"][..., 0][attention], batch["responses"][attention])
