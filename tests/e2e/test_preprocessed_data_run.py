"""Issue 3's acceptance: GSM8K in its published format → our preprocessing script → parquet → one GRPO step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import compose_config

REPO = Path(__file__).resolve().parents[2]


def test_gsm8k_parquet_trains_one_grpo_step(ray_local, tmp_path):
    from dagrl.data import read_rows
    from dagrl.main import run
    from dagrl.rewards import get_reward

    out = tmp_path / "gsm8k"
    subprocess.run(
        [
            sys.executable,
            "gsm8k.py",
            "--local_src",
            str(REPO / "tests/fixtures/gsm8k"),
            "--local_dir",
            str(out),
        ],
        cwd=REPO / "examples/data_preprocess",
        check=True,
        capture_output=True,
    )
    rows = read_rows([str(out / "train.parquet")])
    reward = get_reward("gsm8k")
    truth = rows[0]["reward_model"]["ground_truth"]
    assert reward(f"so the answer is #### {truth}", truth, {}) == 1.0
    assert reward(f"so the answer is #### {truth}1", truth, {}) == 0.0

    run_dir = tmp_path / "run"
    run(
        compose_config(
            f"data.train_files={out / 'train.parquet'}",
            f"data.val_files={out / 'test.parquet'}",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "data.max_prompt_length=1024",
            "data.max_response_length=4",
            "trainer.total_training_steps=1",
            "trainer.logger=[console]",
            "trainer.progress_bar=false",
            f"trainer.default_local_dir={run_dir}",
        )
    )
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert "val/reward/openai/gsm8k/mean" in metrics[0] and "reward/openai/gsm8k/mean" in metrics[1]
    assert "actor/pg_loss" in metrics[1]
