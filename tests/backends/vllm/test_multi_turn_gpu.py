"""vLLM multi-turn episodes on one GPU with the shipped tiny model: the engine's log-probs of the
policy's tokens match the trainer's forward over prompt + responses (observations attended), and
the same seed gives the same episodes although requests enter the engine one by one.

    python -m pytest -q -m gpu tests/backends/vllm/test_multi_turn_gpu.py
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from dagrl.backends.torch.train import TorchTrainBackend  # noqa: E402
from dagrl.backends.vllm.rollout import VLLMRolloutBackend  # noqa: E402
from dagrl.config.role_specs import role_spec  # noqa: E402
from dagrl.core.plugins import load_plugins  # noqa: E402
from dagrl.core.worker import ParallelContext  # noqa: E402
from tests.conftest import validated_config  # noqa: E402
from tests.train_backends import train_backend  # noqa: E402

DTYPE = os.environ.get("DAGRL_TEST_VLLM_DTYPE", "float32")
# prompt 32 + response 48 is past the tiny model's 64 positions (RoPE: the trainer extrapolates the
# same way); vLLM refuses such a context unless told (dagrl's rules name it before Ray otherwise)
os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
CTX = ParallelContext(0, 1, torch.device("cuda", 0))
MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.fixture(scope="module")
def setup():
    # validated, as in a run (the learning rate among the defaults it resolves), once the plugin has
    # registered the environment the config names
    load_plugins(["tests/plugins/quiz_env.py"])
    cfg = validated_config(
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # compared with the trainer's below
        f"actor_rollout_ref.model.dtype={DTYPE}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
        "actor_rollout_ref.rollout.enforce_eager=true",  # start in seconds: test_vllm_gpu.py runs the compiled engine
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "trainer.device=cuda",
        "external_plugins=[tests/plugins/quiz_env.py]",
        "dag=grpo_multi_turn",
        f"{MT}.enable=true",
        f"{MT}.environment=quiz",
        f"{MT}.max_tool_response_length=8",
        "data.max_response_length=48",
    )
    rollout, trainer = (
        VLLMRolloutBackend(role_spec(cfg, "rollout"), CTX),
        train_backend(TorchTrainBackend, cfg, CTX),
    )
    yield cfg, rollout, trainer
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompts():
    from dagrl.backends.hf_model import load_tokenizer, resolve_model_path
    from dagrl.data.builtin import generate_rows
    from dagrl.data.parquet import PromptDataset
    from dagrl.trainer.loop import collate

    tok = load_tokenizer(resolve_model_path(None))
    data = PromptDataset.from_rows(generate_rows("test", 64, 1), tok, max_prompt_length=32, source="test")
    return collate([data[i] for i in range(64)], tok.pad_token_id, 1, 0)


def test_multi_turn_logprobs_match_the_trainer(setup, prompts):
    _, rollout, trainer = setup
    batch = prompts.select(["prompts", "prompt_mask"])
    out, metrics = rollout.generate(batch, seed=3)
    assert metrics["multi_turn/assistant_turns"] == 3.0 and metrics["multi_turn/observations"] == 2.0
    mask, attn = out["response_mask"].bool(), out["response_attention_mask"].bool()
    assert bool((mask <= attn).all()) and bool((mask < attn).any())
    scored, _ = trainer.forward_logprobs(batch.union(out), "old_logprobs")
    diff = (scored["old_logprobs"] - out["rollout_logprobs"])[mask].abs()
    tol = 2e-3 if DTYPE == "float32" else 5e-2
    assert diff.mean() < tol and diff.max() < 50 * tol, (float(diff.mean()), float(diff.max()))
    again, _ = rollout.generate(batch, seed=3)  # per (episode, turn) seeds: the same episodes
    assert torch.equal(again["responses"], out["responses"])
