"""Tensor bytes that cross to or from the driver per step, with and without data staying on the workers.

    python bench/driver_bytes.py [--steps 3] [overrides ...]        # default GRPO (tiny CPU model)
    python bench/driver_bytes.py algorithm=gkd                      # GKD, colocated teacher, full vocabulary
    python bench/driver_bytes.py algorithm=gkd algorithm.gkd.gkd_logits_topk=8

Runs the job three times for `--steps` steps: with both residency plans emptied (every output back
to the driver and put again, the data's columns sent to every reader: the dataflow before
residency), with the outputs' plan only (outputs whose consumers run on the producer's workers
stay there, dagrl/core/residency.py: plan_residency), and as it ships (the data's columns stored
by their first reader's workers as well: plan_inputs). Same counter, same call path. Prints
`perf/driver_bytes` per step for the three, and `perf/kept_bytes` (outputs kept on the workers
that computed them) and `perf/handed_bytes` (outputs handed from pool to pool through Ray's
object store, passed by the driver as refs) as it ships. The prompts' n samples travel as the
prompt in all three (`Batch.repeats`: not a plan, the collated batch's own form).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from unittest import mock

MODES = ("none", "outputs", "all")  # what stays on the workers: nothing, outputs, outputs and inputs


def run(overrides: list[str], steps: int, out: str, mode: str) -> list[dict]:
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

    def nothing(dag, roles, names):
        return {}

    outputs = scheduler.plan_residency if mode != "none" else nothing
    inputs = scheduler.plan_inputs if mode == "all" else nothing
    with (
        mock.patch.object(scheduler, "plan_residency", outputs),
        mock.patch.object(scheduler, "plan_inputs", inputs),
    ):
        run_job(cfg)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args, overrides = ap.parse_known_args()
    rows = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix="driver-bytes-") as out:
            rows[mode] = run(overrides, args.steps, out, mode)
    print(f"overrides: {' '.join(overrides) or '(default GRPO)'}")
    print("step  driver bytes: all to driver  outputs kept  outputs and data kept  kept bytes  handed bytes")
    for none, outputs, both in zip(*(rows[m] for m in MODES)):
        print(
            f"{both['step']:>4}  {none['perf/driver_bytes']:>26,.0f}  {outputs['perf/driver_bytes']:>12,.0f}"
            f"  {both['perf/driver_bytes']:>21,.0f}  {both['perf/kept_bytes']:>10,.0f}"
            f"  {both.get('perf/handed_bytes', 0):>12,.0f}"
        )


if __name__ == "__main__":
    main()
