"""End-to-end SFT (algorithm=sft) on the built-in task from a freshly initialised tiny model: the
validation loss falls, through a checkpoint and a resume, with sequence packing on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import compose_config


def fresh_tiny_model(out: Path) -> str:
    """The shipped tiny model's architecture and tokenizer with freshly initialised weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dagrl.data.builtin import tiny_model_path

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_path())).save_pretrained(out)
    for f in Path(tiny_model_path()).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out)
    return str(out)


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
    assert all(r["perf/pad_fraction"] >= 0 for r in rows if "perf/pad_fraction" in r)
    assert "val/reward/mean" in rows[-1]  # greedy accuracy on the validation prompts
