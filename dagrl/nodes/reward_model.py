"""Reward models as roles, as node kinds: orm_score / rm_score (one score per response), prm_score
(per-step scores, aggregated), and sample_score (the sampling pipeline's weighted sum)."""

from __future__ import annotations

import torch

from dagrl.backends.reward_model import RewardModelBackend  # declares rm_scores / prm_* keys
from dagrl.config.sample_schema import PrmAggregate, RewardModelType
from dagrl.core.batch import Batch, declare_key
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.rewards.judge import judge_scores, render_judge_prompt
from dagrl.rewards.steps import step_ends

declare_key("prm_scores", "[B] a process reward model's score of each response (its steps aggregated)")
declare_key("sample_scores", "[B] the sampling pipeline's filter score (rule + orm + prm, weighted)")

_SEQ = ("prompts", "prompt_mask", "responses", "response_mask")


class _ModelScore:
    required_inputs = _SEQ
    optional_inputs = ()
    outputs = ("rm_scores",)
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    def run(self, runtime, batch):
        out = runtime.role(self.spec.role).call(RewardModelBackend.score, batch.select(_SEQ))
        scores = out["rm_scores"]
        return NodeResult(out, {f"reward/{self.spec.role}_mean": float(scores.mean())})


@register_node_kind("orm_score")
class OrmScoreNode(_ModelScore):
    """The sampling pipeline's outcome reward model (sample.orm_model) on role `orm`."""

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.sample.orm_model is not None


@register_node_kind("rm_score")
class RmScoreNode(_ModelScore):
    """GRPO's reward model (reward.model.*) on role `rm`; the reward node adds it by weight. With
    reward.model.type=generative the role is an LLM judge: the prompts it reads are rendered here
    from the policy's text (judge_prompts), its answers parsed here (rewards/judge.py)."""

    optional_inputs = ("ground_truth",)  # the judge template's {ground_truth}

    def __init__(self, spec, cfg):
        self.spec, self.model = spec, cfg.reward.model

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.reward.model.enable

    def run(self, runtime, batch):
        if self.model.type != RewardModelType.generative:
            return super().run(runtime, batch)
        from dagrl.backends.judge import HFJudgeBackend  # declares judge_prompts / judge_outputs

        m = self.model
        answers = runtime.role(self.spec.role).call(HFJudgeBackend.judge, judge_prompts(runtime, batch, m))
        scores, failures = judge_scores(
            list(answers["judge_outputs"]),
            m.judge_score_pattern,
            m.judge_score_min,
            m.judge_score_max,
            m.judge_neutral_score,
        )
        metrics = {f"reward/{self.spec.role}_mean": float(scores.mean()), JUDGE_FAILURES: float(failures)}
        return NodeResult(Batch({"rm_scores": scores}), metrics)


JUDGE_FAILURES = "reward/judge_failures"  # judgments that gave no score in range (scored neutral)


def judge_prompts(runtime, batch: Batch, m) -> Batch:
    """judge_prompts: reward.model.judge_template filled with each row's prompt and response text
    (special tokens dropped) and its ground truth ("" where the data has none)."""
    from dagrl.nodes.reward import decode_responses

    prompts = decode_responses(runtime.tokenizer, batch["prompts"], batch["prompt_mask"])
    responses = decode_responses(runtime.tokenizer, batch["responses"], batch["response_mask"])
    truths = list(batch["ground_truth"]) if "ground_truth" in batch.meta else [""] * len(batch)
    texts = [
        render_judge_prompt(m.judge_template, p, r, "" if t is None else str(t))
        for p, r, t in zip(prompts, responses, truths)
    ]
    return Batch(meta={"judge_prompts": texts})


@register_node_kind("prm_score")
class PrmScoreNode:
    """A process reward model (sample.prm_model) on role `prm`: a score after every step of each
    response (steps end at sample.step_separator), aggregated by sample.prm_aggregate."""

    required_inputs = _SEQ
    optional_inputs = ()
    outputs = ("prm_scores", "prm_step_scores")
    remote = True

    def __init__(self, spec, cfg):
        self.spec, self.sample = spec, cfg.sample

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.sample.prm_model is not None

    def run(self, runtime, batch):
        ends = step_ends(
            runtime.tokenizer, batch["responses"], batch["response_mask"], self.sample.step_separator
        )
        seq = batch.select(_SEQ).union(Batch({"prm_step_ends": ends}))
        steps = runtime.role(self.spec.role).call(RewardModelBackend.score_steps, seq)["prm_step_scores"]
        scores = aggregate_steps(steps, ends >= 0, self.sample.prm_aggregate)
        metrics = {
            "reward/prm_mean": float(scores.mean()),
            "prm/steps_mean": float((ends >= 0).sum(1).float().mean()),
        }
        return NodeResult(Batch({"prm_scores": scores, "prm_step_scores": steps}), metrics)


def aggregate_steps(steps: torch.Tensor, valid: torch.Tensor, how: PrmAggregate) -> torch.Tensor:
    """[B] from per-step scores [B, S] where `valid`; a row without steps scores 0."""
    any_step = valid.any(1)
    if how == PrmAggregate.min:
        out = steps.masked_fill(~valid, float("inf")).min(1).values
    elif how == PrmAggregate.last:
        last = (valid.sum(1) - 1).clamp(min=0)
        out = steps.gather(1, last[:, None])[:, 0]
    else:
        out = (steps * valid).sum(1) / valid.sum(1).clamp(min=1)
    return torch.where(any_step, out, torch.zeros_like(out))


@register_node_kind("sample_score")
class SampleScoreNode:
    """The filter's score: rule_weight × rule rewards + orm_weight × ORM + prm_weight × PRM."""

    required_inputs = ("scores",)
    optional_inputs = ("rm_scores", "prm_scores")
    outputs = ("sample_scores",)
    remote = False

    def __init__(self, spec, cfg):
        self.sample = cfg.sample

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        s = self.sample
        total = s.rule_weight * batch["scores"].float()
        if "rm_scores" in batch.tensors:
            total = total + s.orm_weight * batch["rm_scores"]
        if "prm_scores" in batch.tensors:
            total = total + s.prm_weight * batch["prm_scores"]
        return NodeResult(Batch({"sample_scores": total}), {"sample/score_mean": float(total.mean())})
