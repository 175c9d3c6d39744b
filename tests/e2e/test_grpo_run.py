"""End-to-end GRPO runs on the CPU with the shipped tiny model, real Ray workers and real data."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import compose_config
from tests.train_backends import train_backend

# Small and fast: a few prompts, short steps, no validation unless asked.
FAST = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "trainer.logger=[console]",
    "trainer.progress_bar=false",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
]


def read_metrics(run_dir) -> list[dict]:
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def without_timing(row: dict) -> dict:
    """A step's metrics less what the machine decides: timings, rates and the process's resident
    host memory (perf/host_rss_gib, perf/host_peak_rss_gib)."""
    skip = ("timing_s/", "weight_sync/s", "weight_sync/GBps", "rollout/tokens_per_s", "perf/host_")
    return {k: v for k, v in row.items() if not k.startswith(skip) and not k.endswith("_ms")}


@pytest.mark.slow
def test_default_run_learns(ray_local, tmp_path):
    """The embedded default (as `python -m dagrl.main` runs it) raises the validation reward.

    Validated before and after only: validation draws with a seed of its own, so the default's
    validations at steps 10-30 (~1.8 s each on 2 cores) change no step of training; measured, the
    step-40 figure is 0.516 either way (0.273 -> 0.406 / 0.422 / 0.469 / 0.516 at 10 / 20 / 30 / 40)."""
    from dagrl.main import run

    run(
        compose_config(
            f"trainer.default_local_dir={tmp_path}", "trainer.progress_bar=false", "trainer.test_freq=40"
        )
    )
    rows = read_metrics(tmp_path)
    before = rows[0]["val/reward/mean"]
    after = rows[-1]["val/reward/mean"]
    assert rows[0]["step"] == 0 and rows[-1]["step"] == 40
    assert after >= before + 0.2, f"validation reward {before:.3f} -> {after:.3f}"


def test_resume_reproduces_uninterrupted_run(ray_local, grpo_run, tmp_path):
    """4 steps == the step-2 checkpoint resumed for 2 steps: model, optimizer, data position and
    sampling restored."""
    resume_matches(tmp_path, straight=grpo_run)
    assert (grpo_run / "global_step_2" / "actor" / "config.json").is_file()


def test_separate_rollout_pool_receives_weights_through_ray(ray_local, separate_run, tmp_path):
    """Rollout on its own worker: weights are broadcast each step, from the second sync on in the
    engine's own layout straight into its parameters; the run equals one through the loader."""
    from safetensors.torch import load_file

    from dagrl.backends.hf_model import resolve_model_path
    from dagrl.main import run
    from tests.e2e.conftest import SEPARATE

    rows = read_metrics(separate_run)
    state = load_file(f"{resolve_model_path(None)}/model.safetensors")
    model_bytes = sum(t.numel() * 4 for t in state.values())  # float32 run
    assert all(r["weight_sync/bytes"] == pytest.approx(model_bytes, rel=0.01) for r in rows)
    assert [r["weight_sync/direct"] for r in rows] == [0.0, 1.0, 1.0]
    # where a direct sync's time went (weight_sync.py: sync_weights), every step
    phases = "export_draw pack send_host send wire unpack receive_host engine receive".split()
    assert all(r[f"weight_sync/{p}_ms"] >= 0 for r in rows[1:] for p in phases)
    assert all(0 < r["weight_sync/wire_ms"] <= r["weight_sync/receive_ms"] for r in rows[1:])
    assert "weight_sync/driver_ms" in rows[1]
    loader = tmp_path / "loader"
    run(
        compose_config(
            *SEPARATE,
            "trainer.total_training_steps=3",
            "actor_rollout_ref.rollout.weight_sync_direct=false",
            f"trainer.default_local_dir={loader}",
        )
    )
    loaded = read_metrics(loader)
    assert [r["weight_sync/direct"] for r in loaded] == [0.0, 0.0, 0.0]
    same = ["reward/mean", "response_length/mean", "actor/pg_loss", "actor/entropy"]
    assert [[r[k] for k in same] for r in rows] == [[r[k] for k in same] for r in loaded]


def test_separate_pools_hand_the_rollout_over_past_the_driver(separate_run, grpo_run):
    """With the rollout on a pool of its own, its outputs reach the update through Ray's object
    store (16 rows × 8 tokens of responses and mask, int64, and log-probs, fp32), and the driver
    moves less than twice what it moves colocated (the prompts, as their 4 distinct rows, go to
    each pool, the responses come back once for the reward). Before, it got every output back and
    put it again: more than twice."""
    colocated = read_metrics(grpo_run)
    for row, same_step in zip(read_metrics(separate_run), colocated):
        assert row["perf/handed_bytes"] == 16 * 8 * (8 + 8 + 4)
        assert row["perf/driver_bytes"] < 2 * same_step["perf/driver_bytes"]


def test_a_colocated_sync_says_where_its_time_went(grpo_run):
    """The colocated refresh is a hand-over with the copy inside it: each stage's time is in the
    step's metrics (weight_sync.py _copy_local), and together they fit inside the sync's."""
    stages = ("settle", "wake_weights", "load", "release", "wake_kv")
    for row in read_metrics(grpo_run):
        ms = [row[f"weight_sync/{stage}_ms"] for stage in stages]
        assert all(m >= 0 for m in ms) and row["weight_sync/load_ms"] > 0
        assert sum(ms) <= row["weight_sync/s"] * 1e3


def test_two_train_workers_ddp_over_gloo(ray_local, tmp_path):
    """Two colocated workers: DP=2 shards, DDP all-reduces gradients, both replicas stay equal."""
    from dagrl.main import run

    run(
        compose_config(
            *FAST,
            "trainer.n_gpus_per_node=2",
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and "actor/kl_loss" in rows[-1]
    ranks = [
        torch.load(tmp_path / "global_step_2" / "actor" / f"train_state_rank{r}.pt", weights_only=False)
        for r in (0, 1)
    ]
    states = [list(r["optimizer"]["state"].values()) for r in ranks]
    assert len(states[0]) == len(states[1]) > 0  # every parameter's moments, on both ranks
    for s0, s1 in zip(*states, strict=True):
        assert torch.equal(s0["exp_avg"], s1["exp_avg"])  # identical averaged gradients on both ranks
    assert any(s["exp_avg"].abs().sum() > 0 for s in states[0])  # and the steps moved them


def test_exported_hf_model_reloads_with_identical_logits(tmp_path):
    """After a real update, the exported directory loads in transformers and gives the same logits."""
    from transformers import AutoModelForCausalLM

    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.validate import resolve_defaults
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext

    cfg = compose_config(
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
    )
    resolve_defaults(cfg)
    backend = train_backend(TorchTrainBackend, cfg, ParallelContext(0, 1, torch.device("cpu")))
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        {
            "prompts": torch.randint(5, 60, (4, 6), generator=g),
            "prompt_mask": torch.ones(4, 6, dtype=torch.long),
            "responses": torch.randint(5, 60, (4, 3), generator=g),
            "response_mask": torch.ones(4, 3, dtype=torch.long),
            "old_logprobs": torch.full((4, 3), -2.0),
            "advantages": torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(4, 3),
        }
    )
    before = [p.detach().clone() for p in backend.model.parameters()]
    backend.train_step(batch)
    assert any(not torch.equal(a, b) for a, b in zip(before, backend.model.parameters()))
    backend.export_hf(str(tmp_path / "hf"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = torch.randint(5, 60, (2, 9), generator=g)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, backend.model.eval()(ids).logits)


def resume_matches(tmp_path, *overrides: str, straight=None, weights: bool = False) -> list[dict]:
    """4 steps straight == the same run resumed from its step-2 checkpoint and run to step 4:
    model, optimizer, data position and sampling restored. Returns the run's rows (steps 1-4).

    Two runs, not three: the straight run (or `straight`, the directory of one made with the same
    overrides and save_freq=2) writes the checkpoint the second one resumes from, by path, into a
    directory of its own; a piece of state the checkpoint lost shows as steps 3-4 that differ.
    With `weights`, both save at step 4 and the two step-4 actors are bit-identical."""
    from dagrl.main import run

    fast = [*FAST, *overrides, "trainer.total_training_steps=4"]
    if straight is None:
        straight = tmp_path / "straight"
        run(compose_config(*fast, "trainer.save_freq=2", f"trainer.default_local_dir={straight}"))
    resumed = tmp_path / "resumed"
    step2 = straight / "global_step_2"
    save = ["trainer.save_freq=2"] if weights else []
    run(compose_config(*fast, *save, f"trainer.resume_mode={step2}", f"trainer.default_local_dir={resumed}"))
    a = [without_timing(r) for r in read_metrics(straight)]
    b = [without_timing(r) for r in read_metrics(resumed)]
    assert [r["step"] for r in a] == [1, 2, 3, 4] and [r["step"] for r in b] == [3, 4]
    assert a[2:] == b
    if weights:
        from safetensors.torch import load_file

        ours, theirs = (
            load_file(d / "global_step_4" / "actor" / "model.safetensors") for d in (straight, resumed)
        )
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    return a
