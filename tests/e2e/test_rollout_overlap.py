"""Rollout one step ahead (separate placement, overlap_steps=1), the on-policy update without the
old-log-prob pass, and the rollout-vs-trainer mismatch metrics: real runs on the CPU (hf rollout)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import compose_config
from tests.e2e.conftest import SEPARATE
from tests.e2e.test_grpo_run import FAST, read_metrics

R = "actor_rollout_ref.rollout"


def test_overlap_samples_one_step_ahead_and_checkpoints_the_data_position(ray_local, separate_run, tmp_path):
    from dagrl.main import run

    overlap, sync = tmp_path / "overlap", separate_run  # sync: the same run without overlap
    common = ["trainer.total_training_steps=3", "trainer.save_freq=2"]
    run(compose_config(*SEPARATE, *common, f"{R}.overlap_steps=1", f"trainer.default_local_dir={overlap}"))
    rows = read_metrics(overlap)
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["weight_sync/bytes"] > 0 and "reward/mean" in r and "timing_s/rollout" in r for r in rows)

    # the checkpoint at step 2 was taken while batch 3 was being sampled: it must record the data
    # position before batch 3, as a synchronous run does
    def data_state(root):
        with open(root / "global_step_2" / "trainer_state.json") as f:
            return json.load(f)["data"]

    assert data_state(overlap) == data_state(sync)
    # resume from step 3 (the last step saves): step 4 is sampled after the restart, then overlap resumes
    run(
        compose_config(
            *SEPARATE,
            "trainer.total_training_steps=5",
            "trainer.save_freq=2",
            f"{R}.overlap_steps=1",
            f"trainer.default_local_dir={overlap}",
        )
    )
    resumed = read_metrics(overlap)[len(rows) :]
    assert [r["step"] for r in resumed] == [4, 5]
    assert [r["rollout/staleness"] for r in resumed] == [0.0, 1.0]


def test_on_policy_update_skips_the_old_logprob_pass(ray_local, tmp_path):
    from dagrl.main import run

    run(
        compose_config(
            *FAST,
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.recompute_old_logprobs=false",
            "algorithm.rollout_correction.rollout_is=token",
            "trainer.total_training_steps=2",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]  # both steps ran and logged: the checks below see them
    assert all("timing_s/old_logprob" not in r and "timing_s/actor_update" in r for r in rows)
    for r in rows:  # hf rollout and torch trainer, both fp32 on the CPU: the same probabilities
        assert r["rollout_corr/logprob_abs_diff_max"] < 1e-3
        assert r["rollout_corr/ratio_min"] <= r["rollout_corr/ratio_mean"] <= r["rollout_corr/ratio_max"]
        assert r["rollout_corr/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert r["rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert r["actor/pg_clipfrac"] == 0.0  # ratio 1: nothing to clip
