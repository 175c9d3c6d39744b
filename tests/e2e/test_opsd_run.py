"""End-to-end OPSD and the distillation options on the CPU through real Ray workers: the shipped
student distilled from the shipped teacher reading the built-in rows' privileged prompt; resumes
that reproduce the uninterrupted run (off-policy steps and the SFT term included); the student as
its own teacher; the reverse KL to a teacher as GRPO's reward."""

from __future__ import annotations

import pytest

from dagrl.nodes.rollout import is_off_policy_step
from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics, resume_matches


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@pytest.mark.slow
def test_default_opsd_run_learns(ray_local, tmp_path):
    """`python -m dagrl.main algorithm=opsd`, its first 20 steps (see test_gkd_run's FIRST_20): the
    divergence falls and the validation reward rises. Recorded (mean divergence of the first / last
    5 steps; val/reward/mean): 20 steps 0.168 -> 0.097 (x0.58), 0.273 -> 0.516; 40 steps
    0.168 -> 0.071, 0.273 -> 0.562."""
    from dagrl.main import run
    from tests.e2e.test_gkd_run import FIRST_20

    run(compose_config("algorithm=opsd", *FIRST_20, f"trainer.default_local_dir={tmp_path}"))
    rows = read_metrics(tmp_path)
    train = [r for r in rows if "distill/divergence" in r]
    assert rows[0]["step"] == 0 and rows[-1]["step"] == 20
    first, last = (
        mean(r["distill/divergence"] for r in train[:5]),
        mean(r["distill/divergence"] for r in train[-5:]),
    )
    assert last < 0.75 * first, f"divergence {first:.4f} -> {last:.4f}"
    before, after = rows[0]["val/reward/mean"], rows[-1]["val/reward/mean"]
    assert after >= before + 0.15, f"validation reward {before:.3f} -> {after:.3f}"
    assert all(f"timing_s/{node}" in train[-1] for node in ("rollout", "teacher_hidden", "actor_update"))


def test_opsd_resume_reproduces_uninterrupted_run(ray_local, tmp_path):
    rows = resume_matches(tmp_path, "algorithm=opsd")
    assert all(r["distill/divergence"] > 0 for r in rows)


def test_off_policy_steps_and_sft_term_resume_bit_identically(ray_local, tmp_path):
    """lmbda 0.5: steps 2-4 draw the dataset's responses (trainer.seed 1), step 1 samples."""
    assert [is_off_policy_step(1, s, 0.5) for s in range(1, 5)] == [False, True, True, True]
    rows = resume_matches(tmp_path, "algorithm=gkd", "algorithm.gkd.lmbda=0.5", "algorithm.gkd.sft_alpha=0.5")
    assert [r["distill/off_policy_step"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert rows[0]["distill/sft_nll"] == 0.0 and all(r["distill/sft_nll"] > 0 for r in rows[1:])
    assert all(r["reward/mean"] == 1.0 for r in rows[1:])  # the reference answers are right


def test_self_current_teacher_runs_on_the_train_workers(ray_local, tmp_path):
    """OPSD with the policy as its own teacher: no teacher pool, the train role scores."""
    from dagrl.main import run

    run(
        compose_config(
            *FAST,
            "algorithm=opsd",
            "teacher.model=self_current",
            "algorithm.gkd.gkd_logits_topk=16",
            "trainer.total_training_steps=2",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and all(r["distill/divergence"] > 0 for r in rows)


@pytest.mark.slow
def test_reverse_kl_reward_pulls_grpo_toward_the_teacher(ray_local, tmp_path):
    """GRPO with the per-token reverse KL to the shipped teacher in its advantages: the KL falls.
    16 steps: last 4 / first 4 = 0.61 (2.197 -> 1.346; 20 steps: 0.64, 8 steps: 0.87), bar 0.7."""
    from dagrl.main import run

    run(
        compose_config(
            "algorithm.distill_reward.coef=1.0",
            "trainer.total_training_steps=16",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.progress_bar=false",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    first, last = (
        mean(r["distill/reverse_kl"] for r in rows[:4]),
        mean(r["distill/reverse_kl"] for r in rows[-4:]),
    )
    assert last < 0.7 * first, f"reverse KL {first:.4f} -> {last:.4f}"
