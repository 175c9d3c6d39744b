"""actor_rollout_ref.model.use_remove_padding on the torch backend: the packed forward gives the
padded one's log-probs, entropies, top-k log-probs, loss and gradients, on tiny Qwen2 / Qwen3 /
Llama models built in code, for a batch of very different prompt and response lengths."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from dagrl.core.batch import Batch
from dagrl.core.worker import ParallelContext
from dagrl.objectives import TokenRequest
from tests.conftest import compose_config
from tests.train_backends import train_backend

VOCAB = 64
SIZES = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128,
)  # fmt: skip
MODELS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}
TOL = dict(rtol=0, atol=2e-5)  # fp32; measured differences are ~1e-6


def mixed_batch(rows: int = 8, prompt_len: int = 24, resp_len: int = 30, seed: int = 0) -> Batch:
    """Prompts of 1..prompt_len tokens, responses of 0..resp_len (one empty, one full-length)."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, prompt_len + 1, (rows,), generator=g)
    resp_lens = torch.randint(1, resp_len + 1, (rows,), generator=g)
    prompt_lens[0], resp_lens[0] = prompt_len, resp_len  # the longest sequence
    prompt_lens[1], resp_lens[1] = 1, 3
    resp_lens[2] = 0
    prompt_mask = (torch.arange(prompt_len)[None] >= prompt_len - prompt_lens[:, None]).long()
    response_mask = (torch.arange(resp_len)[None] < resp_lens[:, None]).long()
    return Batch(
        {
            "prompts": torch.randint(1, VOCAB, (rows, prompt_len), generator=g) * prompt_mask,
            "prompt_mask": prompt_mask,
            "responses": torch.randint(1, VOCAB, (rows, resp_len), generator=g) * response_mask,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, resp_len, generator=g) * response_mask,
            "teacher_topk_ids": torch.randint(0, VOCAB, (rows, resp_len, 3), generator=g),
        }
    )


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_dir(request, tmp_path_factory):
    config_cls, model_cls = MODELS[request.param]
    torch.manual_seed(0)
    model = model_cls(config_cls(**SIZES, tie_word_embeddings=request.param == "qwen3"))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return str(path)


def backend(model_dir: str, packing: bool, *overrides: str):
    from dagrl.backends.torch.train import TorchTrainBackend

    cfg = compose_config(
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.model.use_remove_padding={packing}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "trainer.device=cpu",
        *overrides,
    )
    return train_backend(TorchTrainBackend, cfg, ParallelContext(0, 1, torch.device("cpu")))


def outputs_and_grads(be, batch: Batch):
    """Log-probs, entropy and top-k log-probs with grad, and the parameter gradients of a sum of them."""
    request = TokenRequest(logprobs=True, entropy=True, entropy_grad=True, logprobs_at="teacher_topk_ids")
    be.model.zero_grad()
    out = be._token_outputs(be.model, batch, request)
    mask = batch["response_mask"]
    w = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    ((out.logprobs * w + out.entropy * w.flip(1)) * mask).sum().add(
        (out.logprobs_at * mask[..., None]).sum()
    ).backward()
    grads = {n: p.grad.clone() for n, p in be.model.named_parameters()}
    return out, grads


def test_packed_forward_matches_padded_values_and_gradients(model_dir):
    batch = mixed_batch()
    mask = batch["response_mask"]
    padded, padded_grads = outputs_and_grads(backend(model_dir, False), batch)
    packed, packed_grads = outputs_and_grads(backend(model_dir, True), batch)
    torch.testing.assert_close(packed.logprobs * mask, padded.logprobs * mask, **TOL)
    torch.testing.assert_close(packed.entropy * mask, padded.entropy * mask, **TOL)
    m3 = mask[..., None]
    torch.testing.assert_close(packed.logprobs_at * m3, padded.logprobs_at * m3, **TOL)
    assert (packed.logprobs[~mask.bool()] == 0).all()  # response padding gets 0
    for name, grad in padded_grads.items():  # fp32 sums in another order: relative to the scale
        scale = float(grad.abs().max())
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=2e-6 * scale, msg=name)


def test_packed_update_matches_padded_update(model_dir):
    """forward_logprobs, then one GRPO step (entropy bonus on): loss, grad norm and the new weights."""
    batch = mixed_batch()
    entropy = "actor_rollout_ref.actor.entropy_coeff=0.01"
    results = []
    for packing in (False, True):
        be = backend(model_dir, packing, entropy)
        inputs = batch.select(("prompts", "prompt_mask", "responses", "response_mask"))
        old = be.forward_logprobs(inputs, "old_logprobs")[0]["old_logprobs"]
        step = batch.select(inputs.keys() | {"advantages"}).union(Batch({"old_logprobs": old - 0.05}))
        _, metrics = be.train_step(step)
        results.append((old, metrics, {k: v.clone() for k, v in be.model.state_dict().items()}))
    (old_a, m_a, w_a), (old_b, m_b, w_b) = results
    mask = batch["response_mask"]
    torch.testing.assert_close(old_b * mask, old_a * mask, **TOL)
    assert m_b["actor/pg_loss"] == pytest.approx(m_a["actor/pg_loss"], rel=1e-4, abs=1e-7)
    assert m_b["actor/grad_norm"] == pytest.approx(m_a["actor/grad_norm"], rel=1e-4)
    for name, weight in w_a.items():
        torch.testing.assert_close(w_b[name], weight, rtol=0, atol=1e-5, msg=name)
    # the mixed batch is mostly padding; packing removes nearly all of it
    assert m_a["perf/pad_fraction"] == m_b["perf/pad_fraction"] > 0.3
    assert "perf/packed_pad_fraction" not in m_a
    assert m_b["perf/packed_pad_fraction"] < m_b["perf/pad_fraction"]


def test_gpu_logprob_pass_indexes_the_gathered_logits():
    """The GPU branch's fused pass (here its torch implementation) over [N, V] gathered logits."""
    from dagrl.algos import entropy_from_logits, logprobs_from_logits
    from dagrl.backends.torch.packed import _fused

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, VOCAB, generator=g)
    targets = torch.randint(0, VOCAB, (7,), generator=g)
    logprobs, entropy = _fused(logits, targets, 0.7, entropy=True)
    scaled = logits[None] / 0.7
    torch.testing.assert_close(logprobs, logprobs_from_logits(scaled, targets[None])[0])
    torch.testing.assert_close(entropy, entropy_from_logits(scaled)[0])
