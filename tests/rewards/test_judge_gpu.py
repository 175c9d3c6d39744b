"""The generative judge on vLLM (reward.model.engine=vllm) on a GPU: a tiny random Qwen3 judges
arithmetic rows through RmScoreNode; every fitting prompt gets an answer, a prompt longer than
the judge's context gets none, failures are counted and scored neutral; its greedy answers mostly
match the HF judge's on the same weights (float32 both).

Run on the GPU machine: python -m pytest -m gpu tests/rewards/test_judge_gpu.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

from dagrl.backends.hf_model import load_tokenizer  # noqa: E402
from dagrl.backends.judge import HFJudgeBackend  # noqa: E402
from dagrl.backends.vllm.judge import VLLMJudgeBackend  # noqa: E402
from dagrl.config.role_specs import role_spec  # noqa: E402
from dagrl.core.node import NodeSpec  # noqa: E402
from dagrl.core.worker import ParallelContext  # noqa: E402
from dagrl.nodes.reward_model import JUDGE_FAILURES, RmScoreNode  # noqa: E402
from tests.conftest import compose_config  # noqa: E402
from tests.rewards.test_judge import _Runtime, arith_batch  # noqa: E402
from tools.random_qwen3 import build_random_qwen3  # noqa: E402

CTX = ParallelContext(0, 1, torch.device("cuda", 0))


def test_vllm_judge_answers_counts_failures_and_matches_hf(tmp_path):
    # std 0.2: peaked next-token distributions, so greedy answers rarely flip between engines
    model = build_random_qwen3(
        str(tmp_path / "judge"), 128, 2, 4, 2, 256, 512, seed=1, init_std=0.2, max_positions=64
    )
    cfg = compose_config(
        "reward.model.enable=true",
        "reward.model.type=generative",
        "reward.model.engine=vllm",
        f"reward.model.path={model}",
        "actor_rollout_ref.model.dtype=float32",  # the rm role takes the model dtype
        "reward.model.judge_template='{prompt} {response} Score:'",
        r"reward.model.judge_score_pattern='(\d+)'",
        "reward.model.judge_max_new_tokens=8",
        "reward.model.gpu_memory_utilization=0.1",
        "+reward.model.engine_kwargs.enforce_eager=true",
        "placement.colocate_groups=[[train,rollout,ref,rm]]",
        "trainer.device=cuda",
    )
    tokenizer = load_tokenizer(model)
    answers = ["7", "30", "68", "99", "12", "45", "1" * 60]  # the last does not fit 64 positions
    batch = arith_batch(tokenizer, [(3, 4), (10, 20), (41, 27), (50, 49), (6, 6), (20, 25), (1, 1)], answers)
    spec = NodeSpec(name="rm", kind="rm_score", role="rm")
    engine = VLLMJudgeBackend(role_spec(cfg, "rm"), CTX)
    try:
        out = RmScoreNode(spec, cfg).run(_Runtime(engine, tokenizer), batch)
        from dagrl.nodes.reward_model import judge_prompts

        texts = engine.judge(judge_prompts(_Runtime(engine, tokenizer), batch, cfg.reward.model))[
            "judge_outputs"
        ]
    finally:
        engine.shutdown()
    assert all(isinstance(t, str) for t in texts[:-1]) and texts[-1] is None
    assert out.metrics[JUDGE_FAILURES] >= 1 and out.batch["rm_scores"][-1].item() == 0.5
    assert ((out.batch["rm_scores"] >= 0) & (out.batch["rm_scores"] <= 1)).all()
    hf = HFJudgeBackend(role_spec(cfg, "rm"), CTX)
    hf_texts = hf.judge(judge_prompts(_Runtime(hf, tokenizer), batch, cfg.reward.model))["judge_outputs"]
    assert hf_texts[-1] is None
    same = sum(a == b for a, b in zip(texts[:-1], hf_texts[:-1]))
    assert same >= len(texts[:-1]) // 2, (texts, hf_texts)
