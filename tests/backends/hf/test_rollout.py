"""dagrl.backends.hf.rollout: rollout.ignore_eos keeps sampling past EOS, as vLLM does."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dagrl.core.batch import Batch
from tests.conftest import compose_config
from tests.tiny_models import tiny_qwen2

R = "actor_rollout_ref.rollout"
LENGTH = 6


def _rollout(model: str, *overrides: str):
    from dagrl.backends.hf.rollout import HFRolloutBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.config.validate import resolve_defaults
    from dagrl.core.worker import ParallelContext

    cfg = compose_config(
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"data.max_response_length={LENGTH}",
        f"{R}.temperature=0",
        *overrides,
    )
    resolve_defaults(cfg)
    return HFRolloutBackend(role_spec(cfg, "rollout"), ParallelContext(0, 1, torch.device("cpu")))


def _prompts() -> Batch:
    prompts = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    return Batch({"prompts": prompts, "prompt_mask": (prompts != 0).long()})


def test_ignore_eos_samples_to_the_full_length(tmp_path):
    """The shipped tiny model, greedy, with its first answer tokens made EOS: a response ends after
    one token, unless ignore_eos, where it runs on from the same token to max_response_length."""
    from dagrl.backends.hf_model import resolve_model_path

    model = tmp_path / "model"
    shutil.copytree(resolve_model_path(None), model)
    first, _ = _rollout(str(model)).generate(_prompts(), seed=1)
    config = json.loads((model / "generation_config.json").read_text())
    config["eos_token_id"] = sorted({config["eos_token_id"], *first["responses"][:, 0].tolist()})
    (model / "generation_config.json").write_text(json.dumps(config))

    stopped, _ = _rollout(str(model)).generate(_prompts(), seed=1)
    assert stopped["response_mask"].sum(1).tolist() == [1, 1]
    kept, _ = _rollout(str(model), f"{R}.ignore_eos=true").generate(_prompts(), seed=1)
    assert kept["response_mask"].sum(1).tolist() == [LENGTH, LENGTH]
    assert torch.equal(kept["responses"][:, 0], first["responses"][:, 0])


# ---- the KV cache under the name a model's output gives it ------------------------------------


class _Named(torch.nn.Module):
    """A tiny Qwen2 whose forward takes and returns its KV cache under one name only: `cache`
    (transformers 5.x) or `past_key_values` (4.x). Other keywords are swallowed, as the **kwargs of
    a transformers forward would, so a cache passed under the wrong name is silently dropped."""

    def __init__(self, model, name: str | None):
        super().__init__()
        self.inner, self.name = model, name
        self.generation_config = model.generation_config

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False, **kwargs):
        from types import SimpleNamespace

        out = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=kwargs.get(self.name) if self.name else None,
            use_cache=use_cache,
        )
        fields = {"logits": out.logits}
        if self.name:
            fields[self.name] = out.cache
        return SimpleNamespace(**fields)


def _decoder(model):
    """An hf rollout around `model` (no model directory: the decode loop is what is tested)."""
    from types import SimpleNamespace

    from dagrl.backends.hf.rollout import HFRolloutBackend

    backend = HFRolloutBackend.__new__(HFRolloutBackend)
    backend.model, backend.max_response, backend.pad_id, backend.eos_ids = model, LENGTH, 0, []
    backend.ctx = SimpleNamespace(device=torch.device("cpu"))
    backend.settings = SimpleNamespace(ignore_eos=True)
    return backend


def _greedy_without_cache(model, prompts: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Greedy tokens by recomputing the whole sequence at every step (the reference)."""
    ids, attn, tokens = prompts, mask, []
    for _ in range(LENGTH):
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
        token = logits[:, -1].argmax(-1)
        tokens.append(token)
        ids = torch.cat([ids, token[:, None]], 1)
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
    return torch.stack(tokens, 1)


@pytest.mark.parametrize("name", ["cache", "past_key_values", "model's own"])
def test_decode_reads_the_kv_cache_by_the_name_the_output_has(name):
    """Greedy decoding with the cache gives the tokens of a full recompute, whether the model takes
    and returns its cache as `cache` (transformers 5.x), as `past_key_values` (4.x) or is a plain
    transformers model; a cache dropped on the way would decode from the last token alone."""
    qwen = tiny_qwen2()
    model = qwen if name == "model's own" else _Named(qwen, name)
    prompts = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (prompts != 0).long()
    with torch.no_grad():
        expected = _greedy_without_cache(qwen, prompts, mask)
        tokens, alive, _ = _decoder(model)._generate(
            Batch({"prompts": prompts, "prompt_mask": mask}), None, 1.0, 1.0, 0, greedy=True
        )
    assert alive.all()
    assert torch.equal(tokens, expected)


def test_a_model_that_returns_no_kv_cache_is_refused():
    """A forward that returns no cache under either name is one error naming the model class, not
    responses decoded from the last token alone."""
    from dagrl.errors import DagrlError

    prompts = torch.tensor([[5, 6, 7]])
    with torch.no_grad(), pytest.raises(DagrlError, match=r"_Named.*KV cache.*rollout.name=vllm"):
        _decoder(_Named(tiny_qwen2(), None))._generate(
            Batch({"prompts": prompts, "prompt_mask": torch.ones_like(prompts)}), None, 1.0, 1.0, 0, True
        )
