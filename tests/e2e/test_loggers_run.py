"""`python -m dagrl.main` as a TRL / wandb user runs it: a TRL-form reward from a plugin file, wandb in
offline mode, and the same command twice (one metrics series per directory)."""

from __future__ import annotations

import glob
import json
import os
import textwrap

import pytest

from tests.conftest import main_in_process

# docs/compat.md's TRL reward and its command, `python -m dagrl.main 'external_plugins=[my_rewards.py]'
# 'reward.functions=[{name: exact_answer}]'`, run where the reader saved the file (a relative path)
TRL_REWARD = """
def exact_answer(completions, prompts, ground_truth, **kwargs):
    assert len(prompts) == len(completions) and "+" in prompts[0]
    return [float(c.strip() == g) for c, g in zip(completions, ground_truth)]
"""


def test_a_step_twice_with_wandb_offline_and_a_trl_reward(tmp_path, monkeypatch, capsys, ray_local):
    """The command line's `main(argv)` in this process on the session's Ray (a fresh interpreter
    and a Ray of its own cost ~25 s a run on 2 cores; what the command prints is the same)."""
    pytest.importorskip("wandb")
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(TRL_REWARD))
    out = tmp_path / "run"
    argv = [
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=1",  # a second step logs nothing a first does not
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
        "trainer.logger=[console,wandb]",
        "external_plugins=[my_rewards.py]",  # relative: the workers import it too
        "reward.functions=[{name: exact_answer}]",
        f"trainer.default_local_dir={out}",
    ]
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)  # outside the checkout
    for _ in range(2):  # the same command twice
        code, printed = main_in_process(capsys, *argv)
        assert code == 0, printed[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # one series, not two
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)
    assert len(glob.glob(str(out / "previous_runs" / "*" / "metrics.jsonl"))) == 1
    runs = glob.glob(str(out / "wandb" / "offline-run-*"))
    assert len(runs) == 2 and all(glob.glob(os.path.join(r, "*.wandb")) for r in runs)
    assert "moved to" in printed
