"""GKD, OPSD and the reverse-KL distillation reward over multi-turn episodes, end to end on the CPU
(Ray workers, hf rollout, torch trainer and teacher): the environment plugin written only in
tests/ puts two observations inside every response; the teacher reads them, the loss counts only
the policy's tokens (tests/objectives/test_multi_turn_distill.py proves the masking)."""

from __future__ import annotations

import math

import pytest

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics

MT = "actor_rollout_ref.rollout.multi_turn"
EPISODES = [
    "external_plugins=[tests/plugins/quiz_env.py]",
    f"{MT}.enable=true",
    f"{MT}.environment=quiz",
    f"{MT}.max_tool_response_length=8",
    "data.max_response_length=48",
]


@pytest.mark.parametrize(
    "overrides, loss_key",
    [
        # full vocabulary (teacher_hidden); lmbda 0.5: step 2 is the data's one-turn responses
        (["algorithm=gkd", "dag=gkd_multi_turn", "algorithm.gkd.lmbda=0.5"], "distill/divergence"),
        # top-k, the teacher reading each row's privileged prompt before the episode
        (["algorithm=opsd", "dag=opsd_multi_turn", "algorithm.gkd.gkd_logits_topk=8"], "distill/divergence"),
        # GRPO with the teacher's log-probs of the policy's tokens as a reward
        (["dag=grpo_multi_turn", "algorithm.distill_reward.coef=0.5"], "distill/reverse_kl"),
    ],
    ids=["gkd", "opsd", "distill_reward"],
)
def test_distillation_over_multi_turn_episodes(ray_local, tmp_path, overrides, loss_key):
    from dagrl.main import run

    run(
        compose_config(
            *FAST,
            *EPISODES,
            *overrides,
            "data.train_batch_size=2",  # 2 prompts x 2 episodes: the smoke, not learning
            "actor_rollout_ref.rollout.n=2",
            "trainer.total_training_steps=2",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    sampled = [r for r in rows if r.get("distill/off_policy_step", 0.0) == 0.0]
    assert sampled and all(r["multi_turn/observations"] == 2.0 for r in sampled)
    assert all(math.isfinite(r[loss_key]) and r[loss_key] != 0.0 for r in rows)
    if "algorithm.gkd.lmbda=0.5" in overrides:
        assert [r["distill/off_policy_step"] for r in rows] == [0.0, 1.0]
