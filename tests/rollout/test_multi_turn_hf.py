"""Multi-turn episodes on the hf rollout with the shipped tiny model: the trainer scores exactly
the ids the policy sampled, with the rollout's log-probs, on the policy's tokens only."""

from __future__ import annotations

import pytest
import torch

from dagrl.core.batch import Batch
from dagrl.core.plugins import load_plugins
from tests.conftest import compose_config
from tests.train_backends import train_backend

MT = "actor_rollout_ref.rollout.multi_turn"
QUIZ = [
    "external_plugins=[tests/plugins/quiz_env.py]",
    "dag=grpo_multi_turn",
    f"{MT}.enable=true",
    f"{MT}.environment=quiz",
    f"{MT}.max_tool_response_length=8",
    "data.max_response_length=48",
]


class RecordingSampler:
    """Wraps a sampler and keeps every context it was asked to continue, per episode."""

    def __init__(self, inner):
        self.inner, self.contexts = inner, {}
        self.turn_synchronous = inner.turn_synchronous

    def submit(self, key, context, max_tokens):
        self.contexts.setdefault(key, []).append(list(context))
        self.inner.submit(key, context, max_tokens)

    def poll(self):
        samples = self.inner.poll()
        self.sampled = getattr(self, "sampled", {})
        for s in samples:
            self.sampled.setdefault(s.key, []).append(list(s.token_ids))
        return samples

    def in_flight(self):
        return self.inner.in_flight()


@pytest.fixture(scope="module")
def episodes():
    from dagrl.backends.hf import multi_turn as hf_multi_turn
    from dagrl.backends.hf.rollout import HFRolloutBackend
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.config.validate import resolve_defaults, validate
    from dagrl.core.worker import ParallelContext
    from dagrl.data.builtin import generate_rows
    from dagrl.data.parquet import PromptDataset
    from dagrl.trainer.loop import collate

    cfg = compose_config(*QUIZ)
    load_plugins(cfg.external_plugins)
    resolve_defaults(cfg)
    validate(cfg)
    ctx = ParallelContext(0, 1, torch.device("cpu"))
    rollout = HFRolloutBackend(role_spec(cfg, "rollout"), ctx)
    recorder = {}
    original = hf_multi_turn.HFTurnSampler

    def recording(*args, **kwargs):
        recorder["sampler"] = RecordingSampler(original(*args, **kwargs))
        return recorder["sampler"]

    import dagrl.backends.hf.rollout as hf_rollout

    hf_rollout.HFTurnSampler = recording
    try:
        rows = generate_rows("test", 8, seed=3)
        data = PromptDataset.from_rows(rows, rollout_tokenizer(cfg), max_prompt_length=32, source="test")
        batch = collate([data[i] for i in range(8)], 0, 1, 0)
        out, metrics = rollout.generate(batch.select(("prompts", "prompt_mask", "extra_info")), seed=7)
    finally:
        hf_rollout.HFTurnSampler = original
    trainer = train_backend(TorchTrainBackend, cfg, ctx)
    return cfg, batch, out, metrics, recorder["sampler"], trainer


def rollout_tokenizer(cfg):
    from dagrl.backends.hf_model import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(cfg.actor_rollout_ref.model.path))


def test_episodes_have_three_turns_and_env_rewards(episodes):
    _, _, out, metrics, _, _ = episodes
    assert metrics["multi_turn/assistant_turns"] == 3.0
    assert metrics["multi_turn/observations"] == 2.0
    assert metrics["quiz/answers"] == 3.0  # per episode
    assert torch.equal(out["env_rewards"], torch.full((8,), 0.75))
    assert out["turn_rewards"][:, :3].eq(0.25).all()


def test_trainer_input_is_the_sampled_ids(episodes):
    """Token in, token out: each turn's context is the previous context + the sampled ids +
    the observation ids, and the trainer's sequence (prompt + responses) is the last context +
    the last turn's sampled ids: nothing was re-tokenized."""
    _, batch, out, _, sampler, _ = episodes
    attn = out["response_attention_mask"].bool()
    for row in range(8):
        prompt = batch["prompts"][row][batch["prompt_mask"][row].bool()].tolist()
        contexts, sampled = sampler.contexts[row], sampler.sampled[row]
        assert contexts[0] == prompt and len(sampled) == 3
        for turn in range(1, 3):
            assert contexts[turn][: len(contexts[turn - 1]) + len(sampled[turn - 1])] == (
                contexts[turn - 1] + sampled[turn - 1]
            )
        trained = prompt + out["responses"][row][attn[row]].tolist()
        assert trained == contexts[-1] + sampled[-1]
        policy = out["responses"][row][out["response_mask"][row].bool()].tolist()
        assert policy == sum(sampled, [])


def test_masks_mark_policy_tokens_and_turns(episodes):
    _, _, out, _, _, _ = episodes
    mask, attn, turns = out["response_mask"], out["response_attention_mask"], out["turn_ids"]
    assert bool((mask <= attn).all()) and bool((mask < attn).any())  # observations: attended, not trained
    assert bool((turns[attn.bool()] >= 0).all()) and bool((turns[~attn.bool()] == -1).all())
    assert bool((out["rollout_logprobs"][mask == 0] == 0).all())
    assert set(turns[mask.bool()].tolist()) == {0, 1, 2}


def test_trainer_logprobs_match_rollout_on_policy_tokens(episodes):
    """The trainer's forward over prompt + responses (observations attended) gives the rollout's
    log-probs on every policy token; a forward that does not attend to observations does not."""
    _, batch, out, _, _, trainer = episodes
    full = batch.select(("prompts", "prompt_mask")).union(out)
    logprobs, _ = trainer.forward_logprobs(full, output_key="old_logprobs")
    mask = out["response_mask"].bool()
    diff = (logprobs["old_logprobs"] - out["rollout_logprobs"])[mask].abs().max()
    assert diff < 1e-4, diff
    holes = Batch({k: v for k, v in full.tensors.items() if k != "response_attention_mask"})
    wrong, _ = trainer.forward_logprobs(holes, output_key="old_logprobs")
    assert (wrong["old_logprobs"] - out["rollout_logprobs"])[mask].abs().max() > 1e-2
