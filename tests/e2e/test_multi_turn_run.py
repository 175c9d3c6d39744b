"""A multi-turn GRPO run end to end (Ray workers, hf rollout, torch trainer) with an environment
plugin written only in tests/: resumed from a checkpoint it equals the uninterrupted run, metrics
and weights bit for bit. multi_turn.enable=true alone picks the multi-turn DAG, as in verl."""

from __future__ import annotations

from tests.e2e.test_grpo_run import resume_matches

MT = "actor_rollout_ref.rollout.multi_turn"


def test_multi_turn_resume_reproduces_uninterrupted_run(ray_local, tmp_path):
    rows = resume_matches(
        tmp_path,
        "external_plugins=[tests/plugins/quiz_env.py]",
        f"{MT}.enable=true",
        f"{MT}.environment=quiz",
        f"{MT}.max_tool_response_length=8",
        "data.max_response_length=48",
        weights=True,
    )
    for row in rows:
        assert row["multi_turn/assistant_turns"] == 3.0 and row["multi_turn/observations"] == 2.0
        assert row["reward/env_mean"] == 0.75
        assert row["reward/total_mean"] == row["reward/mean"] + 0.75
