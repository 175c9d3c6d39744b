"""Reward models as roles, as node kinds: orm_score / rm_score (one score per response), prm_score
(per-step scores, aggregated), and sample_score (the sampling pipeline's weighted sum)."""

from __future__ import annotations

import torch

from dagrl.backends.reward_model import RewardModelBackend  # declares rm_scores / prm_* keys
from dagrl.config.sample_schema import PrmAggregate
from dagrl.core.batch import Batch, declare_key
from dagrl.core.node import NodeResult, register_node_kind
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
    """GRPO's reward model (reward.model.*) on role `rm`; the reward node adds it by weight."""

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.reward.model.enable


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
