"""A user plugin written only in tests/ (a role class, its backend, a node kind, a DAG), run from
the command line as a user would: `python -m dagrl.main dag=... external_plugins=[...]` (its
`main`, in this process, on the session's Ray: the workers import the plugin by module name from
the driver's working directory, as they do for a user's run)."""

from __future__ import annotations

import json

from tests.conftest import main_in_process


def test_plugin_role_node_and_dag_from_the_command_line(ray_local, tmp_path, capsys):
    argv = [
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
    code, out = main_in_process(capsys, *argv)
    assert code == 0, out[-4000:]
    assert "echo: 2 workers, DP=2" in out  # the plan has the plugin role on its own two slots
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["echo/step"] for r in rows] == [1.0, 2.0]  # the step reaches the node explicitly
    for r in rows:
        # both workers answered, and the DP-sliced, re-joined counts equal the driver's own
        assert r["echo/workers"] == 2.0 and r["echo/matches"] == 1.0 and r["echo/tokens"] > 0
