"""DAPO on the built-in task, end to end through dynamic sampling's refill: with 2 samples per
prompt about half the groups get equal rewards, so steps draw more prompts (rounds > 1) and train
on full groups only."""

from __future__ import annotations

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics


def test_dapo_refills_the_batch(ray_local, tmp_path):
    from dagrl.main import run

    overrides = [o for o in FAST if not o.startswith("actor_rollout_ref.rollout.n=")]
    run(
        compose_config(
            *overrides,
            "algorithm=dapo",
            "actor_rollout_ref.rollout.n=2",
            "algorithm.filter_groups.max_num_gen_batches=3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one mini-batch: no old-log-prob pass
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert len(rows) == 1
    for r in rows:
        rounds = r["dynamic_sampling/rounds"]
        assert 1 <= rounds <= 3
        assert r["dynamic_sampling/groups_drawn"] == 4 * rounds  # data.train_batch_size per round
        # a step stops drawing once 4 groups varied; at the cap, dropped ones fill the rest
        assert r["dynamic_sampling/groups_kept"] + r["dynamic_sampling/groups_refilled"] >= 4
        assert "actor/pg_loss" in r and "reward/overlong_penalty" in r
    assert rows[0]["dynamic_sampling/rounds"] >= 2  # the refill ran (seeded: 3 rounds)
