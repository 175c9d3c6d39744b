"""Entry point: `python -m dagrl.main key=value ...`.

DictConfig stops here: the composed Hydra config becomes a typed DagrlConfig before anything else.
With no arguments this trains the tiny built-in model with GRPO on the CPU.

The command line is read here, not by Hydra's decorator: verl/siiRL/ms-swift keys are translated
(dagrl/config/compat.py) and every key is checked against the schema (dagrl/config/keys.py) before
Hydra composes, so a wrong key is one line naming it, and Hydra writes no output folder of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

from omegaconf import DictConfig, OmegaConf

from dagrl.config import compat, keys, override_values, swift_keys
from dagrl.config.config_file import check_group_option, file_overrides
from dagrl.config.placement import format_plan
from dagrl.config.schema import DagrlConfig, register_configs
from dagrl.core.failures import RunFailure, as_failure, phase
from dagrl.errors import ConfigError, DagrlError, Interrupted
from dagrl.trainer import interrupt
from dagrl.trainer.logger import log

register_configs()
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")


def run(cfg: DagrlConfig) -> dict[str, float]:
    """Prepare (no Ray), then launch and train. Returns the last step's metrics."""
    from dagrl.trainer.setup import launch, load_data, prepare, rewarder_for

    with phase(
        "setup", mark_own=False
    ):  # any error from here on is one line naming its phase (core/failures.py)
        prepared = prepare(cfg)
    log(format_plan(prepared.plan))
    if prepared.memory is not None:
        from dagrl.trainer.memory_plan import format_memory_plan

        log(format_memory_plan(prepared.memory))
    for warning in prepared.warnings:
        log(f"warning: {warning}")
    if cfg.trainer.dry_run:
        log("dry run: plan printed, no workers started")
        return {}
    from dagrl.sample.runner import is_sampling_job, run_job

    if is_sampling_job(prepared):  # pipeline=sample: shards of scored samples, no training
        with phase("sampling"):
            return run_job(cfg, prepared)
    with phase("data", _data_source(cfg), mark_own=False):
        tokenizer, loader, val = load_data(cfg, prepared.model_path)
    rewarder = rewarder_for(cfg)
    start = time.perf_counter()
    with (
        interrupt.stop_signals(),
        _planned(prepared),
    ):  # Ctrl-C / SIGTERM: finish the step, save, exit 130 / 143
        with phase("setup", "starting the workers", mark_own=False):
            runtime, pools, bundles = launch(prepared, tokenizer, rewarder)
        interrupt.install()  # ray.init put its own SIGTERM handler in place
        log(f"workers ready in {time.perf_counter() - start:.1f}s")
        return _train(cfg, prepared, runtime, pools, bundles, loader, val)


def _data_source(cfg: DagrlConfig) -> str:
    d = cfg.data
    if d.train_files is None:
        return f"the built-in task {d.builtin_task.value} (data.builtin_task)"
    return f"data.train_files={d.train_files}, data.val_files={d.val_files}"


@contextlib.contextmanager
def _planned(prepared):
    """An out-of-memory error names what the memory plan expected in that phase, and its levers."""
    from dagrl.core.device_faults import DeviceError

    try:
        yield
    except DeviceError as exc:
        from dagrl.trainer.capacity import fault_plan_hint

        exc.plan_hint = fault_plan_hint(prepared.memory, prepared.plan, exc.fault)
        raise


def _train(cfg: DagrlConfig, prepared, runtime, pools, bundles, loader, val) -> dict[str, float]:
    import ray

    from dagrl.core.scheduler import Scheduler
    from dagrl.core.worker_death import worker_died
    from dagrl.trainer.loop import Trainer

    scheduler = Scheduler(prepared.dag, runtime)
    validators = tuple(Scheduler(d, runtime) for d in prepared.val_dags) if prepared.val_dags else None
    out_dir = os.path.expanduser(cfg.trainer.default_local_dir)
    trainer = Trainer(cfg, runtime, scheduler, loader, val if validators else None, out_dir, validators)
    try:
        return trainer.fit()
    except ray.exceptions.RayActorError as exc:  # a call that bypassed the pools' own ray.get
        raise worker_died(exc, pools) from exc
    finally:
        scheduler.close()
        for validator in validators or ():
            validator.close()
        for pool in pools:
            pool.shutdown()
        bundles.release()  # a later run in this Ray (tests, notebooks) gets the devices back


def compose(overrides: list[str]) -> DictConfig:
    """The config `overrides` ask for: foreign keys translated, every key checked, then composed."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides, deferred = swift_keys.split_deferred(overrides)  # resolved once the config is composed
    parser, checked = OverridesParser.create(), []
    open_defaults = {k: i.default for k, i in keys.schema_keys().items() if i.open}
    groups = keys.config_groups(CONF_DIR)  # presets (algorithm=gkd, experiment=gkd/...) are not keys
    for text in compat.translate(overrides):
        o, text = override_values.parse(parser, text)
        if o.key_or_group.startswith("hydra."):
            log(f"note: {text} has no effect: dagrl writes no Hydra output folder")
            continue
        if not o.is_delete() and o.key_or_group in groups:
            check_group_option(o.key_or_group, o.value(), CONF_DIR)
        elif not o.is_delete():
            keys.check_key(o.key_or_group, o.value(), open_defaults)
        if o.is_add() and o.key_or_group in keys.schema_keys():
            text = text[1:]  # `+` on a key the schema has: an ordinary override
        elif o.type.name == "CHANGE" and keys.is_new_entry(o.key_or_group, open_defaults):
            text = "+" + text  # a new entry of a free-form dict (engine kwargs, a plugin role's gpus)
        checked.append(text)
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            dcfg = hydra_compose(config_name="config", overrides=checked)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _composition_error(exc, checked) from None
    keys.check_tree(OmegaConf.to_container(dcfg, resolve=False))
    swift_keys.apply_deferred(
        dcfg, deferred, lambda i: _keys_of(compat.translate(overrides[i:], notes=False))
    )
    return dcfg


def _keys_of(overrides: list[str]) -> set[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return {parser.parse_override(o).key_or_group.lstrip("+~") for o in overrides}


def _composition_error(exc: Exception, overrides: list[str]) -> ConfigError:
    """Hydra's multi-line composition failure as one ConfigError naming the full key path."""
    inside = _preset_error(exc)
    if inside is not None:
        return inside
    return override_values.composition_error(exc, overrides, keys.config_groups(CONF_DIR))


def _preset_error(exc: Exception) -> ConfigError | None:
    """A preset that exists but holds a key the schema lacks (e.g. ms-swift's): name the key, its
    dagrl name when it has one, and the preset's file."""
    import re

    text = str(exc)
    where = re.match(r"In '([^']+)':", text)
    key = re.search(r"full_key: (\S+)", text)
    if where is None or key is None or "/" not in where.group(1):
        return None
    found = compat.lookup(key.group(1))
    rule = found[1] if found else None
    name = f"; dagrl's key is {rule.target}" if isinstance(rule, compat.Alias) else keys.suggest(key.group(1))
    return ConfigError(
        key.group(1),
        None,
        f"in preset conf/{where.group(1)}.yaml: not a dagrl key{name}. Presets hold dagrl keys; a file"
        " in ms-swift's (or your own) form runs with --config FILE.yaml",
    )


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """(action, overrides): action is 'help', 'cfg' or None (run). Hydra's own flags that verl
    scripts pass are taken where they mean something here."""
    action, overrides, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        flag, _, attached = arg.partition("=")
        takes_value = flag in ("--cfg", "-c", "--config-name", "-cn", "--config-path", "-cp", "--config")
        value = attached if attached or not takes_value else (argv[i + 1] if i + 1 < len(argv) else "")
        i += 1 if attached or not takes_value else 2
        if flag in ("--help", "-h"):
            action = "help"
        elif flag in ("--cfg", "-c"):
            action = action or "cfg"
        elif flag == "--config":  # one YAML file, dagrl's keys or ms-swift's Ray form (config_file.py)
            overrides += file_overrides(value, CONF_DIR)
        elif flag in ("--config-name", "-cn"):
            overrides += compat.config_name_overrides(value)
        elif flag in ("--config-path", "-cp", "--resolve"):
            pass  # the root config is dagrl's own, always resolved
        elif arg.startswith("-"):
            raise ConfigError(
                "command line", arg, "unknown option; use --help, --cfg job, --config FILE.yaml or key=value"
            )
        else:
            overrides.append(arg)
    return action, overrides


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    cfg: DagrlConfig | None = None
    try:
        action, overrides = parse_args(sys.argv[1:] if argv is None else argv)
        if action == "help":
            print(keys.help_text(CONF_DIR))
            return
        dcfg = compose(overrides)
        if action == "cfg":
            print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
            return
        cfg = OmegaConf.to_object(dcfg)
        run(cfg)
    except Interrupted as exc:
        log(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C while the config and data were read: nothing to save yet
        log("stopped by SIGINT before training started")
        sys.exit(130)
    except DagrlError as exc:
        _fail(exc, cfg)
    except Exception as exc:  # noqa: BLE001 - not one of ours: still one line, the traceback logged
        failure = as_failure(exc)
        failure.__cause__ = exc
        _fail(failure, cfg)


def _fail(exc: DagrlError, cfg: DagrlConfig | None) -> None:
    """Print `exc` as one line and exit 2. The tracebacks go to the run's dagrl.log: always for a
    worker's error or one that is not dagrl's own (the temp dir when the run's is not writable),
    for dagrl's own errors once the run has started (`during` names the phase; not for a typo)."""
    import tempfile

    from dagrl.trainer.run_log import write_failure

    out_dir = os.path.expanduser(cfg.trainer.default_local_dir) if cfg is not None else None
    during = getattr(exc, "during", None)
    line = str(exc)
    if getattr(exc, "details", None) or isinstance(exc, RunFailure):  # their line names the log
        exc.log_path = (out_dir and write_failure(out_dir, exc)) or write_failure(tempfile.gettempdir(), exc)
        line = str(exc)
    elif out_dir and (during or os.path.isdir(out_dir)):
        path = write_failure(out_dir, exc)
        if during:
            line += f" (during {during})" + (f"; full traceback in {path}" if path else "")
    log(f"error: {line}")
    sys.exit(2)


if __name__ == "__main__":
    main()
