"""End-to-end SFT (algorithm=sft) on the built-in task from a freshly initialised tiny model: the
validation loss falls, through a checkpoint and a resume, with sequence packing on; and on a small
slice of the task, greedy accuracy rises from 0 (README "SFT" has the full task's figures)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import compose_config


def fresh_tiny_model(out: Path) -> str:
    """The shipped tiny model's architecture and tokenizer with freshly initialised weights, built
    as tools/build_tiny_model.py builds the shipped one (`--fresh`)."""
    from tools.build_tiny_model import write_fresh_model

    return write_fresh_model(out, seed=0)


def test_sft_from_scratch_lowers_validation_loss_across_a_resume(ray_local, tmp_path):
    from dagrl.main import run

    model = fresh_tiny_model(tmp_path / "fresh")
    common = [
        "algorithm=sft",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.optim.lr=3e-3",
        "data.train_batch_size=16",
        "data.builtin_val_rows=32",
        "trainer.save_freq=8",
        "trainer.test_freq=8",
        "trainer.logger=[console]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    run(compose_config(*common, "trainer.total_training_steps=8"))
    run(compose_config(*common, "trainer.total_training_steps=16"))  # resumes from global_step_8
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/loss"] for r in rows if "val/loss" in r}
    assert sorted(val) == [0, 8, 16] and [r["step"] for r in rows][-8:] == list(range(9, 17))
    assert val[16] < val[8] < val[0] and val[16] < 0.6 * val[0], val  # ~5.6 nats at random init
    # every update ran packed: its rows keep less padding than the padded [B, P + R] layout would
    updates = [r for r in rows if r["step"] > 0]
    assert all(0 <= r["perf/packed_pad_fraction"] < r["perf/pad_fraction"] for r in updates), updates
    assert "val/reward/mean" in rows[-1]  # greedy accuracy on the validation prompts


def test_sft_from_scratch_raises_greedy_accuracy(ray_local, tmp_path):
    """A fresh model learns 8 of the task's problems, answer format and sums: greedy accuracy on
    them goes from 0 to at least one half in 30 steps (a run that does not train, lr=0, stays at 0)
    and their loss falls below a fifth of its start."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dagrl.data.builtin import generate_rows
    from dagrl.main import run

    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(generate_rows("train", 8, seed=0, teacher_prompts=False)), rows)
    run(
        compose_config(
            "algorithm=sft",
            f"actor_rollout_ref.model.path={fresh_tiny_model(tmp_path / 'fresh')}",
            "actor_rollout_ref.actor.optim.lr=3e-3",
            f"data.train_files=[{rows}]",
            f"data.val_files=[{rows}]",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "trainer.total_training_steps=30",
            "trainer.test_freq=30",
            "trainer.save_freq=-1",
            "trainer.logger=[console]",
            "trainer.progress_bar=false",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        )
    )
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r for r in metrics if "val/loss" in r}
    assert sorted(val) == [0, 30]
    assert val[0]["val/reward/mean"] == 0.0 and val[30]["val/reward/mean"] >= 0.5, val
    assert val[30]["val/loss"] < 0.2 * val[0]["val/loss"], val
