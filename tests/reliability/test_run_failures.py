"""No exception reaches the user as a raw traceback, whatever the phase: setup, data, a step,
validation, saving. Each is one line naming the phase, where (the DAG node and role, the plugin
file) and what to change; the traceback goes to <trainer.default_local_dir>/dagrl.log."""

from __future__ import annotations

import json
import shutil

import pytest

from dagrl.data.builtin import tiny_model_path
from tests.conftest import main_in_process

SHORT = [
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "data.builtin_val_rows=2",
    "trainer.total_training_steps=1",
    "trainer.test_freq=-1",
    "trainer.logger=[console]",
    "trainer.progress_bar=false",
]

REWARDS = """
def broken_reward(solution_str, ground_truth, extra_info):
    raise ValueError("reward exploded")
"""

# a multi-turn environment: it runs in the rollout worker, the error crosses Ray
ENVIRONMENT = """
from dagrl.tools import register_environment


class Broken:
    def reset(self, row):
        raise RuntimeError("environment exploded")

    def step(self, action):
        raise RuntimeError("environment exploded")


@register_environment("broken")
def broken(settings, tools, pool):
    return Broken()
"""

ROWS = """
from dagrl.data.transforms import register_row_transform


@register_row_transform
def broken_rows(row):
    if row["extra_info"]["index"] == 1:
        raise KeyError("no_such_column")
    return row
"""


def one_line_and_log(code: int, out: str, run_dir, *says: str) -> str:
    """The error line (the only one, with each of `says` in it); the log holds it and the traceback."""
    assert code == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, out[-3000:]
    line = errors[0]
    assert all(text in line for text in says), line
    assert line.endswith(f"full traceback in {run_dir / 'dagrl.log'}"), line
    log = (run_dir / "dagrl.log").read_text()
    assert "Traceback (most recent call last)" in log
    assert line.removeprefix("error: ").split("; full traceback in")[0].split(" (during ")[0] in log
    return log


@pytest.fixture
def where(tmp_path, monkeypatch, isolated_plugins):
    """The user's directory (plugins beside them, given by relative path), and the run's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "rows.py").write_text(ROWS)
    (tmp_path / "environment.py").write_text(ENVIRONMENT)
    return tmp_path, tmp_path / "run"


def test_setup_a_model_config_transformers_cannot_build(where, capsys):
    home, run = where
    model = home / "model"
    shutil.copytree(tiny_model_path(), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_act": "swishy"}))
    code, out = main_in_process(
        capsys,
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.save_freq=1",  # the checkpoint's size is estimated from the model built on meta
        f"trainer.default_local_dir={run}",
    )
    one_line_and_log(code, out, run, "setup failed: KeyError: 'swishy'", "trainer.dry_run=true")


def test_data_a_row_transform_that_raises_names_its_file(where, capsys):
    home, run = where
    code, out = main_in_process(capsys, "external_plugins=[rows.py]", f"trainer.default_local_dir={run}")
    one_line_and_log(
        code,
        out,
        run,
        "data failed in the built-in task arith",
        "KeyError: 'no_such_column'",
        f"{home / 'rows.py'}:",
    )


def test_step_an_environment_that_raises_in_the_rollout_worker(ray_local, where, capsys):
    home, run = where
    mt = "actor_rollout_ref.rollout.multi_turn"
    code, out = main_in_process(
        capsys,
        *SHORT,
        "trainer.val_before_train=false",
        "external_plugins=[environment.py]",
        "dag=grpo_multi_turn",
        f"{mt}.enable=true",
        f"{mt}.environment=broken",
        f"{mt}.max_tool_response_length=8",
        "data.max_response_length=48",
        f"trainer.default_local_dir={run}",
    )
    log = one_line_and_log(
        code,
        out,
        run,
        "step 1 failed in DAG node rollout (kind rollout, role rollout), role train+rollout",
        "RuntimeError: environment exploded",
        f"raised in {home / 'environment.py'}:7 (external_plugins): fix it there",
    )
    # the worker's own traceback, carried across Ray, down to the plugin's frame (not "(none)")
    worker = log.split("--- traceback in the worker:\n", 1)[1].split("--- traceback on the driver:", 1)[0]
    assert "RuntimeError: environment exploded" in worker and str(home / "environment.py") in worker, log


def test_validation_a_plugin_reward_that_raises(ray_local, where, capsys):
    """The reward composer's own line (the reward, the row), with the phase and the log added."""
    home, run = where
    code, out = main_in_process(
        capsys,
        *SHORT,
        "trainer.val_before_train=true",
        "external_plugins=[rewards.py]",
        "reward.functions=[{name: broken_reward}]",
        f"trainer.default_local_dir={run}",
    )
    one_line_and_log(
        code, out, run, "reward 'broken_reward' failed", "ValueError: reward exploded", "(during validation)"
    )


def test_saving_a_checkpoint_path_taken_by_a_file(ray_local, where, capsys):
    """The step's checkpoint cannot take its place (a file holds global_step_1)."""
    _, run = where
    run.mkdir()
    (run / "global_step_1").write_text("not a checkpoint")
    code, out = main_in_process(
        capsys,
        *SHORT,
        "trainer.val_before_train=false",
        "trainer.save_freq=1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run}",
    )
    one_line_and_log(
        code,
        out,
        run,
        f"saving step 1 failed in {run}: NotADirectoryError",
        "trainer.default_local_dir is writable",
    )
