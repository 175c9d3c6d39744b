"""The GRPO job with actor_rollout_ref.model.use_remove_padding=true trains as the padded one does."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics


def test_packed_run_follows_the_padded_run(ray_local, tmp_path):
    """Same seed, 3 steps: the same rollouts and rewards, losses and grad norms to fp32 rounding."""
    from dagrl.main import run

    runs = {}
    for packing in ("false", "true"):
        out = tmp_path / packing
        run(
            compose_config(
                *FAST,
                "trainer.total_training_steps=3",
                f"actor_rollout_ref.model.use_remove_padding={packing}",
                f"trainer.default_local_dir={out}",
            )
        )
        runs[packing] = read_metrics(out)
    padded, packed = runs["false"], runs["true"]
    assert len(padded) == len(packed) == 3
    for a, b in zip(padded, packed):
        assert b["reward/mean"] == a["reward/mean"]  # the same samples: the weights stayed the same
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
        assert b["perf/pad_fraction"] == a["perf/pad_fraction"]
        assert b["perf/packed_pad_fraction"] <= b["perf/pad_fraction"]
        assert "perf/packed_pad_fraction" not in a
