"""End-to-end sampling pipeline on the CPU, then SFT on what it wrote, in one test:

1. `pipeline=sample` in a subprocess (sampler + orm + prm on one worker) that joins this test's
   Ray (`trainer.ray_address`: a Ray of its own would cost seconds more to start), killed once
   its first shard is written;
2. the same job again, in ms-swift's device_groups form (sampler on two CPU workers, prm + orm
   sharing two more): it skips the finished shards and writes the rest; every prompt's best
   sample is in the output exactly once, and the samples the outcome reward model kept (it alone
   ranks them) are more often correct than the sampler's mean;
3. `algorithm=sft` trains on the shards as they are: their validation loss falls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests import spare_workers
from tests.conftest import compose_config

REPO = Path(__file__).resolve().parents[2]
PROMPTS, SHARD = 24, 4


def sample_overrides(out: Path) -> list[str]:
    from dagrl.data.builtin import tiny_reward_model_path

    rm = tiny_reward_model_path()
    return [
        "pipeline=sample",
        f"sample.output_dir={out}",
        f"sample.max_prompts={PROMPTS}",
        f"sample.shard_size={SHARD}",
        f"sample.orm_model={rm}",
        f"sample.prm_model={rm}",
        # best-of-n by the outcome reward model alone: the rule reward is reported, not used, so the
        # kept samples beat the sampler's mean only if the shipped RM ranks the policy's own samples
        # (the PRM, one step per answer on this task, is computed and written with weight 0)
        "sample.rule_weight=0",
        "sample.orm_weight=1",
        "sample.prm_weight=0",
        "sample.filter=best_of_n",
        "actor_rollout_ref.rollout.n=4",
        "trainer.logger=[console]",
        "trainer.progress_bar=false",
        "trainer.device=cpu",
    ]


def kill_after_first_shard(out: Path, ray_address: str) -> set[str]:
    """Run the job's CLI on the Ray at `ray_address` and SIGKILL its driver once a shard is on disk
    (the driver writes the shards; Ray ends the job's workers when its driver dies)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "dagrl.main", *sample_overrides(out), f"trainer.ray_address={ray_address}"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 600
    while not (out / "shard_00000.parquet").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the job's driver, mid-shard
    _, err = proc.communicate()
    assert (out / "shard_00000.parquet").exists(), err.decode()[-3000:]
    return {p.name for p in out.glob("shard_*.parquet")}


@pytest.mark.own_ray  # four CPU workers
def test_sample_kill_resume_in_device_groups_then_sft(tmp_path):
    import ray

    from dagrl.main import run

    out = tmp_path / "samples"
    if ray.is_initialized():  # four CPU workers: a Ray of this test's own
        ray.shutdown()
    # with the session Ray's preloading workers: the device_groups run's and the SFT run's actors
    # start in processes whose imports are done (tests/spare_workers.py)
    extra = {"_system_config": spare_workers.system_config()} if spare_workers.usable else {}
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        **extra,
    )
    try:
        before = kill_after_first_shard(out, ray.get_runtime_context().gcs_address)
        # from here on only this process's job starts actors: a spare of its own is kept ready
        # (started earlier, it would take the killed job's cores and never serve it)
        spare_workers.keep_one_spare()
        assert len(before) < PROMPTS // SHARD, "the job finished before it was killed"
        groups = (
            "placement.device_groups={nproc_per_node: 4, sample_group: {device: CPU, ranks: 2, workers: [sampler]},"
            " rm_group: {device: CPU, ranks: 2, workers: [prm, orm]}}"
        )
        totals = run(compose_config(*sample_overrides(out), groups, "trainer.n_gpus_per_node=4"))
        assert totals["sample/shards_skipped"] == len(before)
        assert totals["sample/shards_written"] == PROMPTS // SHARD - len(before)
        shards = sorted(out.glob("shard_*.parquet"))
        rows = [r for p in shards for r in pq.read_table(p).to_pylist()]
        # best-of-4 keeps one sample per prompt: every prompt exactly once, none lost or repeated
        assert sorted(r["extra_info"]["source_row"] for r in rows) == list(range(PROMPTS))
        assert not list(out.glob("*.tmp"))
        assert totals["sample/kept_reward_mean"] > totals["sample/reward_mean"], totals
        assert all(len(r["prm_step_scores"]) >= 1 and "orm_score" in r for r in rows)

        files = "[" + ",".join(str(p) for p in shards) + "]"
        sft_dir = tmp_path / "sft"
        run(
            compose_config(
                "algorithm=sft",
                f"data.train_files={files}",
                f"data.val_files={files}",
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.actor.optim.lr=1e-4",
                "trainer.total_training_steps=3",
                "trainer.test_freq=3",
                "trainer.logger=[console]",
                "trainer.progress_bar=false",
                f"trainer.default_local_dir={sft_dir}",
            )
        )
        metrics = [json.loads(line) for line in (sft_dir / "metrics.jsonl").read_text().splitlines()]
        val = {m["step"]: m["val/loss"] for m in metrics if "val/loss" in m}
        assert sorted(val) == [0, 3] and val[3] < val[0], val  # the sampled rows' NLL falls
    finally:
        ray.shutdown()
