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


def test_megatron_lora_run_exports_what_peft_loads(ray_local, tmp_path):
    """The same run on the megatron backend (CPU patch): the reference is the base on the actor's
    workers, the checkpoint holds the adapters only, and the PEFT directory save_hf writes, loaded
    with peft on the base and merged, gives the merged HF model it wrote beside it."""
    import pytest
    import torch

    pytest.importorskip("megatron.core")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dagrl.backends.hf_model import resolve_model_path
    from dagrl.main import run
    from tests.e2e.test_megatron_run import MEGATRON

    run(compose_config(*MEGATRON, *LORA, f"trainer.default_local_dir={tmp_path}"))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["actor/kl_loss"] > rows[0]["actor/kl_loss"] >= 0
    step2 = tmp_path / "global_step_2"
    stored = sum(p.stat().st_size for p in (step2 / "actor").rglob("*") if p.is_file())
    assert stored < 2e6, f"{stored} bytes: more than the adapters and their Adam state"
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(None), dtype=torch.float32)
    peft_merged = PeftModel.from_pretrained(base, step2 / "actor_hf" / "adapter").merge_and_unload()
    merged = AutoModelForCausalLM.from_pretrained(step2 / "actor_hf", dtype=torch.float32)
    want = peft_merged.state_dict()
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-6, msg=name)
