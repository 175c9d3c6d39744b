"""Shared fixtures: one local Ray per test session, and typed configs composed like the CLI does."""

from __future__ import annotations

import copy
import os
import sys

import pytest

# Bytecode caches on, before anything of dagrl is imported: where PYTHONDONTWRITEBYTECODE is set (the
# image of this project's machines sets it), every process of the session (this one, each Ray
# worker, each `python -m dagrl.main` a test starts: ~130) would compile dagrl's 29k lines again,
# ~0.35 s of CPU each on CI's cores (pip compiles site-packages; an editable install's sources it
# does not). Measured with the compositions below, paired on the 2-core machine (config, objectives,
# trainer and three e2e files): 329 s against 349 and 380 s.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# the built-in parts register by name when their packages are imported (dagrl.trainer.setup does
# this for a run; tests that validate or build a DAG directly need them too)
import dagrl.backends  # noqa: E402, F401
import dagrl.nodes  # noqa: E402, F401
import dagrl.objectives  # noqa: E402, F401

_COMPOSED: dict[tuple[str, ...], object] = {}  # compose_config's configs by their overrides


def compose_config(*overrides: str):
    """The typed DagrlConfig that `python -m dagrl.main <overrides>` would run with.

    Composed once a session for the same overrides (Hydra takes ~0.2 s of CI's CPU a composition,
    and composition reads nothing but the overrides, conf/ and the schema); each call gets a copy
    of its own to change."""
    key = tuple(overrides)
    if key not in _COMPOSED:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from dagrl.main import CONF_DIR

        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            _COMPOSED[key] = OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))
    return copy.deepcopy(_COMPOSED[key])


def validated_config(*overrides: str):
    """A composed config after resolve_defaults + validate: what `prepare` checks before the plan
    (no Ray, no model)."""
    from dagrl.config.validate import resolve_defaults, validate

    cfg = compose_config(*overrides)
    resolve_defaults(cfg)
    validate(cfg)
    return cfg


def main_in_process(capsys, *argv: str) -> tuple[int, str]:
    """`python -m dagrl.main argv...` run by this process: (exit code, stdout + stderr).

    For tests of what the command line prints and plans, not of the process itself: a fresh
    interpreter costs seconds of imports on CI's 2 cores. Tests of exit codes under signals, of
    output at import time or of a run's own Ray keep a real subprocess."""
    import traceback

    from dagrl.main import main

    capsys.readouterr()  # what the test printed before is not the command's
    code, trace = 0, ""
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # noqa: BLE001 - what the interpreter would print before exiting 1
        code, trace = 1, traceback.format_exc()
    out = capsys.readouterr()
    return code, out.out + out.err + trace


def start_local_ray():
    """The session's local Ray with 2 CPUs, started if it is not running (each start costs seconds
    on 2 cores). Returns the ray module."""
    import ray

    from tests import spare_workers

    if ray.is_initialized():
        return ray
    # address="local": a Ray of this test session's own, never one another process started here
    local = dict(
        address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False
    )
    if spare_workers.usable:
        try:
            ray.init(**local, _system_config=spare_workers.system_config())
            spare_workers.keep_one_spare()  # the next run's worker starts while this one runs
            return ray
        except RuntimeError:  # a Ray whose GCS does not know those settings exits: run without a spare
            spare_workers.usable = False
            ray.shutdown()
    ray.init(**local)
    return ray


@pytest.fixture
def ray_local():
    """A local Ray with 2 CPUs, started once and reused.

    A test that needs its own cluster (ray.cluster_utils.Cluster) shuts this one down first;
    the next test that asks for ray_local starts it again.
    """
    return start_local_ray()


@pytest.fixture
def isolated_plugins():
    """Row transforms a test's plugins register stay in that test: the registry is restored after
    it, and the shipped plugin modules (dagrl.plugins.*) are forgotten so that the next import
    registers them again."""
    import sys

    from dagrl.data import transforms

    before, modules = list(transforms._TRANSFORMS), set(sys.modules)
    yield
    transforms._TRANSFORMS[:] = before
    for name in set(sys.modules) - modules:
        if name.startswith("dagrl.plugins."):
            del sys.modules[name]


def pytest_collection_modifyitems(config, items):
    """Tests that start a Ray of their own (`own_ray`) run last: each shuts the shared local Ray
    down, and starting it again costs 10-20 s of a 2-core machine."""
    items.sort(key=lambda item: item.get_closest_marker("own_ray") is not None)  # stable


@pytest.fixture(scope="session", autouse=True)
def _ray_shutdown_at_end():
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
