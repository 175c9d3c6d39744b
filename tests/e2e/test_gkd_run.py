"""End-to-end GKD on the CPU: the shipped tiny student distilled from the shipped tiny teacher
through real Ray workers (colocated train + rollout + teacher on one worker)."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics, resume_matches

# the default job cut at 20 of its 40 steps: the learning checks hold there with margin (figures in
# the docstrings) and each run is ~10 s shorter on CI's 2 cores. Validated before and after only
# (the default validates every 10 steps): validation samples with a seed of its own, so skipping
# step 10's changes no step of training and saves its ~2 s
FIRST_20 = ("trainer.total_training_steps=20", "trainer.test_freq=20", "trainer.progress_bar=false")


@pytest.mark.slow
def test_default_gkd_run_learns(ray_local, tmp_path):
    """`python -m dagrl.main algorithm=gkd`, its first 20 steps: the divergence falls and the
    validation reward rises. Recorded (mean divergence of the first / last 5 steps; val/reward/mean):
    20 steps 0.145 -> 0.085 (x0.58), 0.273 -> 0.461; the default's 40 steps 0.145 -> 0.061,
    0.273 -> 0.547. Nothing in the run depends on its length (constant lr after warm-up), so its
    first 20 steps are the default job's."""
    from dagrl.main import run

    run(compose_config("algorithm=gkd", *FIRST_20, f"trainer.default_local_dir={tmp_path}"))
    rows = read_metrics(tmp_path)
    train = [r for r in rows if "distill/divergence" in r]
    assert rows[0]["step"] == 0 and rows[-1]["step"] == 20
    first = sum(r["distill/divergence"] for r in train[:5]) / 5
    last = sum(r["distill/divergence"] for r in train[-5:]) / 5
    assert last < 0.75 * first, f"divergence {first:.4f} -> {last:.4f}"
    before, after = rows[0]["val/reward/mean"], rows[-1]["val/reward/mean"]
    assert after >= before + 0.15, f"validation reward {before:.3f} -> {after:.3f}"


def test_gkd_resume_reproduces_uninterrupted_run(ray_local, tmp_path):
    """4 steps == 2 steps + resume + 2 steps, teacher role included; the teacher named by its path
    (`teacher.model=<path>`, the shipped teacher that algorithm=gkd picks when none is given)."""
    from dagrl.data.builtin import tiny_teacher_path

    rows = resume_matches(tmp_path, "algorithm=gkd", f"teacher.model={tiny_teacher_path()}")
    assert all(r["distill/divergence"] > 0 for r in rows)


@pytest.mark.slow
def test_default_gkd_run_learns_on_megatron(ray_local, tmp_path):
    """`python -m dagrl.main algorithm=gkd actor_rollout_ref.actor.strategy=megatron` on CPU workers
    (the gloo patch as a plugin): megatron student and megatron teacher (teacher_hidden, full
    vocabulary), the student's loss in megatron's schedule. Divergence falls, validation reward rises
    (its first 20 steps; recorded: the torch run's figures above to the fourth decimal)."""
    from dagrl.main import run
    from tests.e2e.test_megatron_run import MEGATRON

    plugin_and_backend = MEGATRON[len(FAST) :]  # the default job's sizes, not FAST's
    run(
        compose_config(
            "algorithm=gkd",
            *plugin_and_backend,
            *FIRST_20,
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    train = [r for r in rows if "distill/divergence" in r]
    assert rows[-1]["step"] == 20 and "timing_s/teacher_hidden" in train[0]
    first = sum(r["distill/divergence"] for r in train[:5]) / 5
    last = sum(r["distill/divergence"] for r in train[-5:]) / 5
    assert last < 0.75 * first, f"divergence {first:.4f} -> {last:.4f}"
    before, after = rows[0]["val/reward/mean"], rows[-1]["val/reward/mean"]
    assert after >= before + 0.15, f"validation reward {before:.3f} -> {after:.3f}"
