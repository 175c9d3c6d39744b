"""GRPO through `dagrl.main` with the megatron backend on CPU workers (gloo), via Ray.

The CPU patch reaches the workers as an `external_plugins` entry (plugins load in every worker).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import compose_config
from tests.e2e.test_grpo_run import FAST, read_metrics, without_timing

pytest.importorskip("megatron.core")

PLUGIN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "plugins", "megatron_cpu.py")
M = "actor_rollout_ref.actor.megatron"
MEGATRON = [
    *FAST,
    f"external_plugins=[{PLUGIN}]",
    "actor_rollout_ref.actor.strategy=megatron",
    f"{M}.param_dtype=float32",
    "trainer.device=cpu",
]


def test_tp2_with_reference_resumes_exactly(ray_local, tmp_path):
    """TP2 actor + colocated TP2 reference (KL loss) + hf rollout on two workers; the sharded
    checkpoint of step 2 resumes to the same metrics as the uninterrupted run (3 == 2 + 1 steps)."""
    from dagrl.main import run

    common = [*MEGATRON, f"{M}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"]
    common += ["actor_rollout_ref.actor.use_kl_loss=true", "trainer.total_training_steps=3"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # each checkpoint also gets actor_hf/, gathered from the TP shards
    saves = ["trainer.save_freq=2", "trainer.save_hf=true"]
    run(compose_config(*common, *saves, f"trainer.default_local_dir={straight}"))
    step2 = straight / "global_step_2"
    run(compose_config(*common, f"trainer.resume_mode={step2}", f"trainer.default_local_dir={resumed}"))
    a = [without_timing(r) for r in read_metrics(straight)]
    b = [without_timing(r) for r in read_metrics(resumed)]
    assert [r["step"] for r in a] == [1, 2, 3] and [r["step"] for r in b] == [3]
    assert "actor/kl_loss" in a[-1]
    perf = ("perf/",)
    assert [{k: v for k, v in r.items() if not k.startswith(perf)} for r in a[2:]] == [
        {k: v for k, v in r.items() if not k.startswith(perf)} for r in b
    ]
    _check_hf_export(step2 / "actor_hf")


def _check_hf_export(path) -> None:
    """transformers loads the export; same tensors as the shipped model, trained ones changed."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from dagrl.backends.hf_model import resolve_model_path

    start = load_file(f"{resolve_model_path(None)}/model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(path)
    state = {k: v for k, v in model.state_dict().items() if k in start}
    assert set(state) == set(start)
    assert all(state[k].shape == v.shape for k, v in start.items())
    assert any(not torch.equal(state[k], v) for k, v in start.items())
    assert (path / "tokenizer.json").is_file()


def _model_bytes() -> int:
    from safetensors.torch import load_file

    from dagrl.backends.hf_model import resolve_model_path

    state = load_file(f"{resolve_model_path(None)}/model.safetensors")
    return sum(t.numel() * 4 for t in state.values())  # float32 run


@pytest.mark.parametrize(
    "layout",
    [
        # PP2 on two workers, rollout colocated: each worker gathers both stages' layers
        [f"{M}.pipeline_model_parallel_size=2", "trainer.n_gpus_per_node=2"],
        # rollout on a worker of its own: train exports, rank 0 ships through the object store
        ["placement=separate", "trainer.n_gpus_per_node=2"],
    ],
    ids=["pp2-colocated", "separate"],
)
def test_weight_sync_delivers_the_whole_model(ray_local, tmp_path, layout):
    from dagrl.main import run

    run(
        compose_config(
            *MEGATRON, *layout, "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}"
        )
    )
    rows = read_metrics(tmp_path)
    assert len(rows) == 2
    assert all(r["weight_sync/bytes"] == pytest.approx(_model_bytes(), rel=0.01) for r in rows)
