"""The megatron critic on one GPU beside the megatron actor: colocated on one worker (bf16 trunk,
fp32 head under megatron's distributed optimizer), each hands the device to the other (the
critic's weights come back bit for bit), its update fits the returns, and both its phases report
their device figures (gathered over the replica); and a short PPO run with both on megatron and
the vLLM engine colocated, which logs them.

Run on the GPU machine: python -m pytest -m gpu -q tests/backends/megatron/test_critic_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch

from dagrl.backends import build_backend
from dagrl.config.role_specs import build_role_specs
from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.batch import Batch
from dagrl.core.worker import Worker
from dagrl.trainer.setup import worker_parts
from tests.backends.test_critic import assert_device_figures, assert_logged_device_figures, batch
from tests.conftest import compose_config
from tests.gpu_runs import REPO, cli_env, failure, run_cli

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
pytest.importorskip("megatron.core")

MEGATRON = ("actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron")


def test_megatron_critic_and_actor_take_turns_on_the_device():
    cfg = compose_config(
        "algorithm=ppo",
        *MEGATRON,
        "trainer.device=cuda",
        "actor_rollout_ref.actor.megatron.param_offload=true",
        "critic.megatron.param_offload=true",
        "critic.megatron.optimizer_offload=true",
        "critic.optim.lr=1e-3",
        "critic.optim.lr_warmup_steps=0",
    )
    resolve_defaults(cfg)
    validate(cfg)
    parts = worker_parts(cfg, build_role_specs(cfg, ["train", "critic"]))
    w = Worker(parts, ["train", "critic"], 0, 1, "cuda", threads=1, build=build_backend)
    w.setup("127.0.0.1", 0)
    critic = w.backends["critic"]
    head = critic.chunks[0].output_layer
    assert (
        head.weight.dtype == torch.float32
        and critic.chunks[0].decoder.layers[0].mlp.linear_fc1.weight.dtype == torch.bfloat16
    )
    b = batch()
    b = Batch({**b.tensors, "returns": torch.ones(4, 4) * b["response_mask"]})
    w.activate("critic")
    snapshot = [p.detach().clone() for p in critic.chunks[0].parameters()]
    w.activate("train")  # the critic leaves the device
    assert critic.chunks[0].embedding.word_embeddings.weight.untyped_storage().nbytes() == 0
    out, values_metrics = w.call("critic", "compute_values", b)  # and comes back bit for bit
    assert all(torch.equal(s, p) for s, p in zip(snapshot, critic.chunks[0].parameters()))
    assert out["values"].dtype == torch.float32 and torch.isfinite(out["values"]).all()
    losses = []
    for _ in range(4):
        values = w.call("critic", "compute_values", b)[0]["values"]
        update_metrics = w.call("critic", "train_step", Batch({**b.tensors, "values": values}))[1]
        losses.append(update_metrics["critic/vf_loss"])
    assert losses[-1] < losses[0], losses
    assert_device_figures({"values": values_metrics, "critic_update": update_metrics})
    # what the critic's last offload freed (its weights and optimizer state), beside its update's figures
    assert update_metrics["critic_update/offload_freed_gib"] == pytest.approx(critic.offload_freed_gib)
    assert critic.offload_freed_gib > 0
    w.shutdown()


def test_ppo_runs_on_megatron_with_vllm_colocated(tmp_path):
    pytest.importorskip("vllm")
    # the engine eager: a start of seconds (the compiled engine runs in tests/backends/vllm/test_vllm_gpu.py)
    cmd = ["algorithm=ppo", *MEGATRON, "trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm"]
    cmd += [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
        "actor_rollout_ref.rollout.enforce_eager=true",
    ]
    cmd += ["trainer.critic_warmup=1", "trainer.total_training_steps=4", "trainer.test_freq=4"]
    cmd += ["trainer.save_freq=4", "trainer.logger=[console]", "trainer.progress_bar=false"]
    cmd += [f"trainer.default_local_dir={tmp_path}"]
    proc = run_cli(cmd, cwd=REPO, env=cli_env(), timeout=240)
    assert proc.returncode == 0, failure(proc)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    steps = [r for r in rows if r["step"] > 0]
    assert steps[0]["actor/critic_warmup"] == 1.0
    assert all(r["critic/vf_loss"] > 0 and "actor/pg_loss" in r for r in steps[1:])
    assert_logged_device_figures(steps)
    assert (tmp_path / "global_step_4" / "critic" / ".metadata").exists()
