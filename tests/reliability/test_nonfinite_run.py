"""Real runs (local Ray, the shipped tiny model): greedy rollouts train; a reward returning NaN is
named, its steps skipped, and the run stops instead of saving no-ops."""

from __future__ import annotations

import math

import pytest

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics


def test_greedy_run_has_finite_losses_and_applies_updates(ray_local, tmp_path):
    from dagrl.main import run

    run(
        compose_config(
            *FAST,
            "actor_rollout_ref.rollout.temperature=0",
            "actor_rollout_ref.actor.entropy_coeff=0.01",  # greedy groups are identical: no advantage
            "trainer.total_training_steps=2",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(math.isfinite(v) for k, v in r.items() if k.startswith(("actor/", "reward/"))), r
        assert r["actor/grad_norm"] > 0 and r["train/nonfinite_grads"] == 0
    assert rows[-1]["train/skipped_steps"] == 0


@pytest.mark.slow
def test_nan_reward_rows_are_named_and_the_run_stops(ray_local, tmp_path, capsys):
    from dagrl.errors import NonFiniteError
    from dagrl.main import run

    cfg = compose_config(
        *FAST,
        "external_plugins=[tests/plugins/nan_reward.py]",
        "reward.functions=[{name: nan_on_odd}]",
        "trainer.max_consecutive_skipped_steps=1",
        "trainer.save_freq=1",
        "trainer.total_training_steps=5",
        f"trainer.default_local_dir={tmp_path}",
    )
    with pytest.raises(
        NonFiniteError, match="stopped at step 2: 2 steps in a row .* the last checkpoint is step 1"
    ):
        run(cfg)
    out = capsys.readouterr().out
    assert "warning: non-finite reward for" in out and "extra_info.index=" in out and "= nan" in out
    assert "warning: step 1: 2 update(s) skipped, non-finite loss (2), gradient (2), reward (" in out
    assert (tmp_path / "global_step_1").is_dir() and not (tmp_path / "global_step_2").exists()
