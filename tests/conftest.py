"""Shared fixtures: one local Ray per test session, and typed configs composed like the CLI does."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# the built-in parts register by name when their packages are imported (dagrl.trainer.setup does
# this for a run; tests that validate or build a DAG directly need them too)
import dagrl.backends  # noqa: E402, F401
import dagrl.nodes  # noqa: E402, F401
import dagrl.objectives  # noqa: E402, F401


def compose_config(*overrides: str):
    """The typed DagrlConfig that `python -m dagrl.main <overrides>` would run with."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dagrl.main import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


@pytest.fixture
def ray_local():
    """A local Ray with 2 CPUs, started once and reused (each start costs seconds on 2 cores).

    A test that needs its own cluster (ray.cluster_utils.Cluster) shuts this one down first;
    the next test that asks for ray_local starts it again.
    """
    import ray

    if not ray.is_initialized():
        # address="local": a Ray of this test session's own, never one another process started here
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False
        )
    return ray


@pytest.fixture(scope="session", autouse=True)
def _ray_shutdown_at_end():
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
