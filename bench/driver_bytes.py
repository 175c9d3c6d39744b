"""Tensor bytes that cross to or from the driver per step, with and without data staying on the workers.

    python bench/driver_bytes.py [--steps 3] [overrides ...]        # default GRPO (tiny CPU model)
    python bench/driver_bytes.py algorithm=gkd                      # GKD, colocated teacher, full vocabulary
    python bench/driver_bytes.py algorithm=gkd algorithm.gkd.gkd_logits_topk=8

Runs the job twice for `--steps` steps: as it ships (outputs whose consumers run on the producer's
workers stay there, dagrl/core/residency.py) and with that plan emptied, i.e. every output back to
the driver and put again, the dataflow before residency (same counter, same call path). Prints
`perf/driver_bytes` and `perf/kept_bytes` per step for both.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from unittest import mock


def run(overrides: list[str], steps: int, out: str, keep: bool) -> list[dict]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import dagrl.core.scheduler as scheduler
    from dagrl.main import CONF_DIR
    from dagrl.main import run as run_job

    fixed = [
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out}",
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[*overrides, *fixed]))
    plan = scheduler.plan_residency if keep else (lambda dag, roles, names: {})
    with mock.patch.object(scheduler, "plan_residency", plan):
        run_job(cfg)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args, overrides = ap.parse_known_args()
    rows = {}
    for keep in (False, True):
        with tempfile.TemporaryDirectory(prefix="driver-bytes-") as out:
            rows[keep] = run(overrides, args.steps, out, keep)
    print(f"overrides: {' '.join(overrides) or '(default GRPO)'}")
    print("step  driver bytes (all to driver)  driver bytes (kept on workers)  kept bytes")
    for before, after in zip(rows[False], rows[True]):
        print(
            f"{after['step']:>4}  {before['perf/driver_bytes']:>28,.0f}  {after['perf/driver_bytes']:>30,.0f}"
            f"  {after['perf/kept_bytes']:>10,.0f}"
        )


if __name__ == "__main__":
    main()
