"""Entry point: `python -m dagrl.main key=value ...`.

DictConfig stops here: the composed Hydra config becomes a typed DagrlConfig before anything else.
With no arguments this trains the tiny built-in model with GRPO on the CPU.
"""

from __future__ import annotations

import os
import sys
import time

import hydra
from omegaconf import DictConfig, OmegaConf

from dagrl.config.placement import format_plan
from dagrl.config.schema import DagrlConfig, register_configs
from dagrl.errors import DagrlError, Interrupted
from dagrl.trainer import interrupt
from dagrl.trainer.logger import log

register_configs()
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")


def run(cfg: DagrlConfig) -> dict[str, float]:
    """Prepare (no Ray), then launch and train. Returns the last step's metrics."""
    from dagrl.trainer.setup import launch, load_data, prepare, rewarder_for

    prepared = prepare(cfg)
    log(format_plan(prepared.plan))
    if cfg.trainer.dry_run:
        log("dry run: plan printed, no workers started")
        return {}
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


@hydra.main(config_path=CONF_DIR, config_name="config", version_base=None)
def _hydra_main(dcfg: DictConfig) -> None:
    cfg: DagrlConfig = OmegaConf.to_object(dcfg)
    try:
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


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
