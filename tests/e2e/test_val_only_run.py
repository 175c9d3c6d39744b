"""trainer.val_only (verl's key): one validation of the current weights, no training step."""

from __future__ import annotations

import pytest

from dagrl.errors import ConfigError
from tests.conftest import compose_config, main_in_process
from tests.e2e.test_grpo_run import FAST, read_metrics


def test_val_only_scores_the_model_it_starts_from_and_takes_no_step(ray_local, tmp_path):
    """Without a checkpoint, val_only scores the model's own weights as val_before_train does at
    step 0. Then two steps of GRPO, validated before and at step 2 and saved at step 2; val_only in
    that directory resumes step 2, syncs its weights to the rollout engine and validates once: the
    same figures as the run's own validation after step 2, and no step 3 trained or saved.

    One test, three runs: the trained run's step-0 validation is the untrained model's."""
    from dagrl.main import run

    common = [*FAST, "data.builtin_val_rows=16"]
    fresh = tmp_path / "fresh"
    before = run(compose_config(*common, "trainer.val_only=true", f"trainer.default_local_dir={fresh}"))
    assert read_metrics(fresh) == [{"step": 0, **before}]

    trained_dir = tmp_path / "trained"
    common.append(f"trainer.default_local_dir={trained_dir}")
    run(
        compose_config(
            *common,
            "trainer.val_before_train=true",
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            "trainer.test_freq=2",
        )
    )
    step0, *_, trained = read_metrics(trained_dir)
    assert step0["step"] == 0 and before["val/reward/mean"] == step0["val/reward/mean"]
    assert trained["step"] == 2 and "val/reward/mean" in trained

    last = run(compose_config(*common, "trainer.total_training_steps=4", "trainer.val_only=true"))
    rows = read_metrics(trained_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 2]  # one row more, at the resumed step
    assert set(rows[-1]) == {"step"} | set(last)
    assert all(k.startswith("val/") for k in last)
    for key in ("val/reward/mean", "val/response_length/mean"):
        assert last[key] == trained[key], key
    assert not (trained_dir / "global_step_3").exists()


def test_val_only_without_validation_data_is_one_line_naming_the_fix(tmp_path, capsys):
    from dagrl.data import write_parquet
    from dagrl.data.builtin import generate_rows

    train = tmp_path / "train.parquet"
    write_parquet(generate_rows("train", 8, 0), str(train))
    code, out = main_in_process(capsys, f"data.train_files={train}", "trainer.val_only=true")
    assert code != 0
    lines = [line for line in out.splitlines() if "trainer.val_only" in line]
    assert len(lines) == 1 and "data.val_files" in lines[0], out


def test_val_only_on_a_dag_without_validation_is_refused():
    from dagrl.trainer.setup import prepare

    with pytest.raises(ConfigError) as info:
        prepare(compose_config("pipeline=sample", "trainer.val_only=true", "trainer.dry_run=true"))
    assert info.value.key == "trainer.val_only"


def test_sft_val_only_places_the_rollout_role_its_validation_samples_with():
    """SFT validates with a DAG of its own (greedy sampling on the rollout role): val_only places
    that role even when no periodic validation is asked for."""
    from dagrl.trainer.setup import prepare

    prepared = prepare(
        compose_config(
            "algorithm=sft",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.val_only=true",
            "trainer.dry_run=true",
        )
    )
    assert prepared.val_dags is not None and "rollout" in prepared.plan.roles
