"""Runs that several end-to-end tests read, made once per session: each run costs worker start-up
(a process importing torch and transformers, loading the model) before its first step, which on
CI's 2 cores is most of a short run. A test that reads one of these asserts on its files only."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config, start_local_ray
from tests.e2e.test_grpo_run import FAST

SEPARATE = [*FAST, "placement=separate", "trainer.n_gpus_per_node=2"]


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory):
    """The directory of FAST GRPO for 4 steps, checkpoints at steps 2 and 4 (colocated, one worker)."""
    from dagrl.main import run

    start_local_ray()
    out = tmp_path_factory.mktemp("grpo_run")
    run(
        compose_config(
            *FAST, "trainer.total_training_steps=4", "trainer.save_freq=2", f"trainer.default_local_dir={out}"
        )
    )
    return out


@pytest.fixture(scope="session")
def separate_run(tmp_path_factory):
    """The directory of FAST GRPO for 3 steps with the rollout on a worker of its own (weights
    broadcast each step), synchronous, a checkpoint at step 2 (and the last step)."""
    from dagrl.main import run

    start_local_ray()
    out = tmp_path_factory.mktemp("separate_run")
    run(
        compose_config(
            *SEPARATE,
            "trainer.total_training_steps=3",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={out}",
        )
    )
    return out
