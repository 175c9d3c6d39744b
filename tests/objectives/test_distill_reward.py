"""On-policy distillation as a reward (algorithm.distill_reward): the per-token reverse KL to the
teacher enters GRPO's advantages through the advantage node, with the teacher_logprob node in the
GRPO DAG only when it is on."""

from __future__ import annotations

import pytest
import torch

from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.batch import Batch
from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled
from dagrl.core.node import NodeSpec
from dagrl.data.builtin import tiny_teacher_path
from dagrl.nodes.advantage import AdvantageNode
from dagrl.nodes.reward_terms import DistillRewardNode
from tests.conftest import compose_config

POOLS = {"train", "rollout", "ref", "teacher"}


def grpo_dag(cfg):
    source, specs = load_dag_specs(cfg.dag)
    return build_dag(cfg.dag, source, prune_disabled(specs, cfg), POOLS)


def test_teacher_node_joins_the_grpo_dag_only_with_the_reward_on():
    off = compose_config()
    resolve_defaults(off)
    assert "teacher_logprob" not in {n.name for n in grpo_dag(off).nodes}
    on = compose_config("algorithm.distill_reward.coef=0.5")
    resolve_defaults(on)
    validate(on)
    assert on.teacher.model == tiny_teacher_path()  # the shipped teacher for the shipped student
    dag = grpo_dag(on)
    assert dag.node("teacher_logprob").outputs == ["teacher_logprobs"]
    assert "teacher_logprob" in dag.deps["distill_reward"]
    assert "distill_reward" in dag.deps["advantage"]


def test_advantage_adds_minus_coef_times_k1_per_token():
    cfg = compose_config("algorithm.distill_reward.coef=0.5")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    student = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    teacher = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -2.5, -0.1]])
    batch = Batch(
        {
            "scores": torch.tensor([1.0, 0.0]),
            "group_ids": torch.tensor([0, 0]),
            "response_mask": mask,
            "old_logprobs": student,
            "teacher_logprobs": teacher,
        }
    )
    term = DistillRewardNode(NodeSpec("distill_reward", "distill_reward"), cfg).run(None, batch)
    out = AdvantageNode(NodeSpec("advantage", "advantage"), cfg).run(None, batch.union(term.batch))
    # GRPO alone: scores 1, 0 in one group -> +0.7071, -0.7071 on every token (std-normalised)
    grpo = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]) / 2**0.5
    # -0.5 * (student - teacher) on real tokens: row 0: -0.5*0.5, -0.5*-1; row 1: 0, -0.5*2, -0.5*-0.4
    kl_term = torch.tensor([[-0.25, 0.5, 0.0], [0.0, -1.0, 0.2]])
    torch.testing.assert_close(out.batch["advantages"], grpo + kl_term, rtol=1e-4, atol=1e-4)
    k1 = (0.5 - 1.0 + 0.0 + 2.0 - 0.4) / 5
    assert term.metrics["distill/reverse_kl"] == pytest.approx(k1, abs=1e-6)
