"""The GRPO job with actor_rollout_ref.model.use_remove_padding=true trains as the padded one does."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics


def test_packed_run_follows_the_padded_run(ray_local, grpo_run, tmp_path):
    """Same seed, 3 steps: the same rollouts and rewards, losses and grad norms to fp32 rounding.
    The padded run is the session's FAST GRPO run (its first 3 steps)."""
    from dagrl.main import run

    run(
        compose_config(
            *FAST,
            "trainer.total_training_steps=3",
            "actor_rollout_ref.model.use_remove_padding=true",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    padded, packed = read_metrics(grpo_run)[:3], read_metrics(tmp_path)
    assert len(padded) == len(packed) == 3
    for a, b in zip(padded, packed):
        assert b["reward/mean"] == a["reward/mean"]  # the same samples: the weights stayed the same
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
        assert b["perf/pad_fraction"] == a["perf/pad_fraction"]
        assert b["perf/packed_pad_fraction"] <= b["perf/pad_fraction"]
        assert "perf/packed_pad_fraction" not in a
