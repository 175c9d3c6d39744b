"""Metric sinks: one series per directory (a fresh run moves an earlier one aside, a resumed run
appends after dropping what came past its checkpoint), wandb offline, a missing wandb named."""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import pytest

from dagrl.errors import ConfigError
from dagrl.trainer.logger import MetricsLogger, check_loggers


def steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in open(path)]


def log_steps(out_dir, loggers, first: int, last: int, start_step: int = 0) -> None:
    m = MetricsLogger(str(out_dir), loggers, "exp", start_step=start_step)
    for step in range(first, last + 1):
        m.write(step, {"reward/mean": step / 10})
    m.close()


def test_rerun_starts_a_new_series_and_keeps_the_old_one(tmp_path):
    log_steps(tmp_path, ["tensorboard"], 0, 3)
    log_steps(tmp_path, ["tensorboard"], 0, 3)  # the same command again
    assert steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3]
    assert len(os.listdir(tmp_path / "tensorboard" / "exp")) == 1  # one event file
    [old] = glob.glob(str(tmp_path / "previous_runs" / "*"))
    assert steps(os.path.join(old, "metrics.jsonl")) == [0, 1, 2, 3]
    assert os.path.isdir(os.path.join(old, "tensorboard", "exp"))


def test_resume_appends_after_its_checkpoint(tmp_path):
    log_steps(tmp_path, [], 0, 5)  # an interrupted run that got to step 5, saved at 3
    log_steps(tmp_path, [], 4, 6, start_step=3)
    assert steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4, 5, 6]
    assert not (tmp_path / "previous_runs").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_writes_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_steps(tmp_path, ["wandb"], 1, 2)
    [run] = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert glob.glob(os.path.join(run, "*.wandb"))


def test_missing_wandb_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(ConfigError, match="trainer.logger.*pip install wandb"):
        check_loggers(["console", "wandb"])
    check_loggers(["console", "tensorboard"])


@pytest.mark.parametrize(
    "missing,given,rest",
    [
        ("wandb", ["console", "tensorboard", "wandb"], "[console,tensorboard]"),
        ("wandb", ["wandb"], "[console]"),
        ("tensorboard", ["tensorboard", "wandb"], "[wandb]"),
    ],
)
def test_a_logger_that_cannot_start_shows_the_list_without_it(monkeypatch, missing, given, rest):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == missing else real(name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ConfigError) as info:
        check_loggers(given)
    assert (info.value.key, info.value.value) == ("trainer.logger", missing)
    assert info.value.fix.endswith(f"drop it from the list: 'trainer.logger={rest}'"), info.value.fix


def test_sft_step_line_shows_the_training_and_validation_nll():
    """SFT logs its NLL as train/loss and its validation's as val/loss (the trainer prefixes the
    val_loss node's `loss`): the console line shows both."""
    from dagrl.objectives.sft import SFT_LOSS
    from dagrl.trainer.logger import format_line

    line = format_line(3, {SFT_LOSS: 0.39813, "val/loss": 0.38836, "timing_s/step": 1.0})
    assert "nll 0.3981" in line and "val_nll 0.3884" in line, line
    assert "nll" not in format_line(3, {"actor/pg_loss": 0.1})  # GRPO's line is unchanged
