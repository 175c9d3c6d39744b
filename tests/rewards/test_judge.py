"""The generative judge (reward.model.type=generative): its template and score parsing by hand,
the HF judge on the shipped tiny model (CPU), failures counted and scored neutral, never raised;
the vLLM judge's engine arguments (the engine itself: tests/rewards/test_judge_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from dagrl.rewards.judge import judge_scores, parse_judge_score, render_judge_prompt
from tests.conftest import compose_config


def test_template_and_parse_by_hand():
    assert render_judge_prompt("{prompt}|{response}|{ground_truth}", "2+2=", "4", "4") == "2+2=|4|4"
    pattern = r"Score:\s*(-?\d+(?:\.\d+)?)"
    assert parse_judge_score("ok. Score: 7.5 done", pattern, 0, 10) == 0.75
    assert parse_judge_score("Score: 3 then Score: 9", pattern, 0, 10) == 0.3  # the first match
    assert parse_judge_score("Score: 2", pattern, 1, 5) == 0.25
    assert parse_judge_score("Score: 11", pattern, 0, 10) is None  # out of range
    assert parse_judge_score("Score: nan", pattern, 0, 10) is None
    assert parse_judge_score("8", r"\d+", 0, 10) == 0.8  # no group: the whole match
    scores, failures = judge_scores(["Score: 10", "garbage", None, "Score: 0"], pattern, 0, 10, 0.5)
    assert scores.tolist() == [1.0, 0.5, 0.5, 0.0] and failures == 2


def judge_config(*extra: str):
    from dagrl.data.builtin import tiny_model_path

    return compose_config(
        "reward.model.enable=true",
        "reward.model.type=generative",
        f"reward.model.path={tiny_model_path()}",
        "placement.colocate_groups=[[train,rollout,ref,rm]]",
        *extra,
    )


class _Role:
    def __init__(self, backend):
        self.backend = backend

    def call(self, method, batch):
        return getattr(self.backend, method.__name__)(batch)


class _Runtime:
    """What RmScoreNode reads of the runtime: the policy's tokenizer and its role handle."""

    def __init__(self, backend, tokenizer):
        self.tokenizer, self.backend = tokenizer, backend

    def role(self, name):
        return _Role(self.backend)


def arith_batch(tokenizer, problems, answers):
    from dagrl.core.batch import Batch, left_pad, right_pad
    from dagrl.data.parquet import tokenize_messages

    prompts = [tokenize_messages(tokenizer, [{"role": "user", "content": f"{a}+{b}="}]) for a, b in problems]
    responses = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in answers]
    p, pm = left_pad(prompts, tokenizer.pad_token_id)
    r, rm = right_pad(responses, tokenizer.pad_token_id, max(map(len, responses)))
    truths = [str(a + b) for a, b in problems]
    return Batch(
        {"prompts": p, "prompt_mask": pm, "responses": r, "response_mask": rm}, {"ground_truth": truths}
    )


def test_hf_judge_on_the_tiny_model_parses_its_scores_and_counts_failures():
    """The tiny arithmetic model as a judge: the template asks it `<response>+0=`, so its greedy
    answer is (mostly) the response's number, parsed and mapped from [0, 100]. A prompt too long for its 64-position context and, under the default pattern, an answer
    without "Score: N" are failures: neutral score, counted, no error."""
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.backends.judge import HFJudgeBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.node import NodeSpec
    from dagrl.core.worker import ParallelContext
    from dagrl.data.builtin import tiny_model_path
    from dagrl.nodes.reward_model import JUDGE_FAILURES, RmScoreNode

    tokenizer = load_tokenizer(tiny_model_path())
    answers = ["7", "30", "68", "99", "12", "45", "150", "1" * 60]
    batch = arith_batch(tokenizer, [(1, 2)] * len(answers), answers)
    template = "reward.model.judge_template='{response}+0='"
    pattern = r"reward.model.judge_score_pattern='(\d+)'"
    cfg = judge_config(
        template, pattern, "reward.model.judge_score_max=100", "reward.model.judge_max_new_tokens=8"
    )
    backend = HFJudgeBackend(role_spec(cfg, "rm"), ParallelContext(0, 1, torch.device("cpu")))
    runtime = _Runtime(backend, tokenizer)
    spec = NodeSpec(name="rm", kind="rm_score", role="rm")
    out = RmScoreNode(spec, cfg).run(runtime, batch)
    scores = out.batch["rm_scores"]
    assert out.metrics[JUDGE_FAILURES] >= 1  # 60 digits do not fit (150 may come back out of range)
    assert scores[-1].item() == 0.5
    expected = torch.tensor([7, 30, 68, 99, 12, 45]) / 100
    assert (scores[:6] - expected).abs().lt(1e-6).sum() >= 3, scores  # the tiny model mostly adds 0 right
    assert ((scores >= 0) & (scores <= 1)).all()
    default_pattern = judge_config(template)  # wants "Score: N": the tiny model never writes it
    out = RmScoreNode(spec, default_pattern).run(runtime, batch)
    assert out.metrics[JUDGE_FAILURES] == len(answers) and out.batch["rm_scores"].eq(0.5).all()


def test_judge_settings_are_checked_before_workers():
    from dagrl.backends.builtin import _check_judge, _check_judge_device
    from dagrl.config.role_specs import role_spec
    from dagrl.errors import ConfigError
    from dagrl.trainer.setup import prepare

    assert role_spec(judge_config(), "rm").backend == "hf_judge"
    with pytest.raises(ConfigError, match="judge_template"):  # the backend's rules run in prepare
        prepare(judge_config("trainer.dry_run=true", "reward.model.judge_template='{answer}'"))
    with pytest.raises(ConfigError, match="judge_score_max"):
        _check_judge(judge_config("reward.model.judge_score_max=-1"))
    with pytest.raises(ConfigError, match="reward.model.engine"):
        _check_judge_device(judge_config("reward.model.engine=vllm"), "cpu")


def test_vllm_judge_engine_arguments():
    from dagrl.backends.vllm.judge import judge_context, judge_llm_kwargs
    from dagrl.config.role_specs import role_spec

    cfg = judge_config("reward.model.engine=vllm", "reward.model.gpu_memory_utilization=0.3")
    spec = role_spec(cfg, "rm")
    assert spec.backend == "vllm_judge"
    context = judge_context(spec, 1 << 20)
    assert context == cfg.data.max_prompt_length + cfg.data.max_response_length + 32 + 512
    assert judge_context(spec, 64) == 64  # no more than the judge model's positions
    kwargs = judge_llm_kwargs(spec, "/m", context)
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["skip_tokenizer_init"]
    assert kwargs["max_model_len"] == context and kwargs["seed"] == cfg.trainer.seed
    eager = judge_config("reward.model.engine=vllm", "+reward.model.engine_kwargs.enforce_eager=true")
    assert judge_llm_kwargs(role_spec(eager, "rm"), "/m", context)["enforce_eager"] is True
