"""LoRA GRPO end to end on the CPU (one short run): the KL reference is the actor's base on the
same worker (no ref model is started), the checkpoint holds the adapters, save_hf writes a merged
model and the PEFT adapter. That a checkpoint resumes bit for bit is tests/backends/torch/test_lora.py's
(the trainer's resume itself is backend-blind: tests/e2e/test_grpo_run.py)."""

from __future__ import annotations

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics

LORA = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "trainer.total_training_steps=2",
    "trainer.save_freq=2",
    "trainer.save_hf=true",
)


def test_lora_run_takes_its_reference_from_the_base(ray_local, tmp_path):
    from dagrl.main import run

    run(compose_config(*FAST, *LORA, f"trainer.default_local_dir={tmp_path}"))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    # the adapter starts at zero (actor == base until the first mini-batch's update); by step 2
    # the actor has left its base further than one mini-batch moves it
    assert rows[1]["actor/kl_loss"] > rows[0]["actor/kl_loss"] >= 0
    step2 = tmp_path / "global_step_2"
    actor = {p.name for p in (step2 / "actor").iterdir()}
    assert "adapter_model.safetensors" in actor and "model.safetensors" not in actor
    assert (step2 / "actor_hf" / "model.safetensors").is_file()
    assert (step2 / "actor_hf" / "adapter" / "adapter_config.json").is_file()
