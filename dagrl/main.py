"""Entry point: `python -m dagrl.main key=value ...`.

DictConfig stops here: the composed Hydra config becomes a typed DagrlConfig before anything else.
With no arguments this trains the tiny built-in model with GRPO on the CPU.

The command line is read here, not by Hydra's decorator: verl/siiRL/ms-swift keys are translated
(dagrl/config/compat.py) and every key is checked against the schema (dagrl/config/keys.py) before
Hydra composes, so a wrong key is one line naming it, and Hydra writes no output folder of its own.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from omegaconf import DictConfig, OmegaConf

from dagrl.config import compat, keys
from dagrl.config.placement import format_plan
from dagrl.config.schema import DagrlConfig, register_configs
from dagrl.errors import ConfigError, DagrlError, Interrupted
from dagrl.trainer import interrupt
from dagrl.trainer.logger import log

register_configs()
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")


def run(cfg: DagrlConfig) -> dict[str, float]:
    """Prepare (no Ray), then launch and train. Returns the last step's metrics."""
    from dagrl.trainer.setup import launch, load_data, prepare, rewarder_for

    prepared = prepare(cfg)
    log(format_plan(prepared.plan))
    for warning in prepared.warnings:
        log(f"warning: {warning}")
    if cfg.trainer.dry_run:
        log("dry run: plan printed, no workers started")
        return {}
    from dagrl.sample.runner import is_sampling_job, run_job

    if is_sampling_job(prepared):  # pipeline=sample: shards of scored samples, no training
        return run_job(cfg, prepared)
    tokenizer, loader, val = load_data(cfg, prepared.model_path)
    rewarder = rewarder_for(cfg)
    start = time.perf_counter()
    with interrupt.stop_signals():  # Ctrl-C / SIGTERM: finish the step, save, exit 130 / 143
        runtime, pools, bundles = launch(prepared, tokenizer, rewarder)
        interrupt.install()  # ray.init put its own SIGTERM handler in place
        log(f"workers ready in {time.perf_counter() - start:.1f}s")
        return _train(cfg, prepared, runtime, pools, bundles, loader, val)


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

    parser, checked = OverridesParser.create(), []
    open_defaults = {k: i.default for k, i in keys.schema_keys().items() if i.open}
    groups = keys.config_groups(CONF_DIR)  # presets (algorithm=gkd, experiment=gkd/...) are not keys
    for text in compat.translate(overrides):
        o = parser.parse_override(text)
        if o.key_or_group.startswith("hydra."):
            log(f"note: {text} has no effect: dagrl writes no Hydra output folder")
            continue
        if not o.is_delete() and o.key_or_group not in groups:
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
    return dcfg


def _composition_error(exc: Exception, overrides: list[str]) -> ConfigError:
    """Hydra's multi-line composition failure as one ConfigError naming the override's key."""
    cause = exc.__cause__ or exc
    key = str(getattr(cause, "full_key", "") or "")
    text = next((o for o in overrides if key and o.lstrip("+~").split("=")[0] == key), None)
    if text is None:  # a config group option that does not exist (algorithm=foo)
        text = next((o for o in overrides if o.split("=")[0] in str(cause)), "")
        key = text.split("=")[0]
    value = text.split("=", 1)[1] if "=" in text else None
    reason = str(cause).strip().splitlines()[0]
    if key in keys.config_groups(CONF_DIR):
        reason = f"no such preset; options: {', '.join(keys.config_groups(CONF_DIR)[key])}"
    return ConfigError(key or "command line", value, reason)


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """(action, overrides): action is 'help', 'cfg' or None (run). Hydra's own flags that verl
    scripts pass are taken where they mean something here."""
    action, overrides, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        flag, _, attached = arg.partition("=")
        takes_value = flag in ("--cfg", "-c", "--config-name", "-cn", "--config-path", "-cp")
        value = attached if attached or not takes_value else (argv[i + 1] if i + 1 < len(argv) else "")
        i += 1 if attached or not takes_value else 2
        if flag in ("--help", "-h"):
            action = "help"
        elif flag in ("--cfg", "-c"):
            action = action or "cfg"
        elif flag in ("--config-name", "-cn"):
            overrides += compat.config_name_overrides(value)
        elif flag in ("--config-path", "-cp", "--resolve"):
            pass  # the root config is dagrl's own, always resolved
        elif arg.startswith("-"):
            raise ConfigError("command line", arg, "unknown option; use --help, --cfg job or key=value")
        else:
            overrides.append(arg)
    return action, overrides


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    try:
        action, overrides = parse_args(sys.argv[1:] if argv is None else argv)
        if action == "help":
            print(keys.help_text(CONF_DIR))
            return
        dcfg = compose(overrides)
        if action == "cfg":
            print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
            return
        cfg: DagrlConfig = OmegaConf.to_object(dcfg)
        run(cfg)
    except Interrupted as exc:
        log(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C while the config and data were read: nothing to save yet
        log("stopped by SIGINT before training started")
        sys.exit(130)
    except DagrlError as exc:
        log(f"error: {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
