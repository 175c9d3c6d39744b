"""A user plugin written only in tests/ (a role class, its backend, a node kind, a DAG), run from
the command line as a user would: `python -m dagrl.main dag=... external_plugins=[...]`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_plugin_role_node_and_dag_from_the_command_line(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "dagrl.main",
        "dag=tests/plugins/echo.yaml",
        "external_plugins=[tests.plugins.echo_role]",
        "+roles.echo=counter",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={tmp_path}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "echo: 2 workers, DP=2" in out  # the plan has the plugin role on its own two slots
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["echo/step"] for r in rows] == [1.0, 2.0]  # the step reaches the node explicitly
    for r in rows:
        # both workers answered, and the DP-sliced, re-joined counts equal the driver's own
        assert r["echo/workers"] == 2.0 and r["echo/matches"] == 1.0 and r["echo/tokens"] > 0
