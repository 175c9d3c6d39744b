"""bench/gpu_matrix.py's run_row on the CPU: the tiny default job as a row's command, so what the
row reads from a real run's metrics (steps, the host figures beside the plan's) is checked before a
card reads it."""

from __future__ import annotations

import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_matrix  # noqa: E402


def test_a_row_reads_the_runs_steps_and_host_memory(tmp_path):
    def tiny(name: str, run_dir: str):
        argv = [
            sys.executable, "-m", "dagrl.main", "trainer.total_training_steps=2",
            f"trainer.default_local_dir={run_dir}", "trainer.test_freq=-1", "trainer.val_before_train=false",
        ]  # fmt: skip
        return argv, dict(os.environ), os.path.join(run_dir, "metrics.jsonl")

    row = gpu_matrix.run_row(str(tmp_path), "tiny", 300, command=tiny)
    shutil.rmtree(os.path.dirname(row["metrics"]), ignore_errors=True)  # run_row's own run directory
    assert row["rc"] == 0 and row["steps"] == 2, row["tail"]
    host = row["host_gib"]
    # the trainer's process: torch and the tiny model, well under a few GiB; its high-water mark at
    # least what it holds; no host line in a plan that keeps nothing there
    assert 0.1 < host["rss"] <= host["peak"] < 8, host
    assert host["plan"] == 0.0


def test_the_plans_host_line_is_read():
    out = "memory plan\n  host memory of node 0: 159.29 GiB = train 137.32 + rollout 21.97\n"
    assert gpu_matrix.plan_host_gib(out) == 159.29
    assert gpu_matrix.plan_host_gib("memory plan\n    update 4.2 = ...\n") == 0.0
