"""The GPU originals of tests/reliability/test_engine_errors.py: the real `python -m dagrl.main`
on one GPU meets (a) vLLM refusing to start because this test process holds most of the GPU's
memory, and (b) a real CUDA out-of-memory in the actor update (micro-batch 256 × 1,025 positions ×
151,936-word vocabulary of logits: ~80 GB in bf16). Each ends with one line on the console, exit
code 2, and the traceback in <run dir>/dagrl.log.

Run on the GPU machine: python -m pytest -m gpu -q tests/reliability/test_engine_errors_gpu.py
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.gpu_runs import REPO, cli_env, run_cli

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, REPO)
from tools.random_qwen3 import build_random_qwen3  # noqa: E402


def run_main(*overrides: str, timeout_s: int = 300) -> tuple[int, str, list[str]]:
    cmd = ["trainer.device=cuda", "trainer.progress_bar=false"]
    cmd += ["trainer.logger=[console]", "trainer.val_before_train=false", "trainer.total_training_steps=1"]
    proc = run_cli([*cmd, *overrides], cwd=REPO, env=cli_env(), timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return proc.returncode, proc.stdout + proc.stderr, lines


def test_vllm_refusing_to_start_is_one_line(tmp_path):
    pytest.importorskip("vllm")
    free, total = torch.cuda.mem_get_info()
    hog = torch.empty(int(free - 0.3 * total), dtype=torch.uint8, device="cuda")  # leave 30% free
    try:
        rc, out, lines = run_main(
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
            f"trainer.default_local_dir={tmp_path}",
        )
    finally:
        del hog
    print(out[-3000:])
    assert rc == 2, out[-3000:]
    line = lines[-1]
    assert line.startswith("error: vLLM refused to start: not enough GPU memory: role rollout, rank 0"), line
    assert "phase setup (building its backend)" in line, line
    assert "actor_rollout_ref.rollout.gpu_memory_utilization (now 0.9)" in line, line
    assert line.endswith(f"full traceback in {tmp_path / 'dagrl.log'}"), line
    assert "Traceback" not in out
    assert "Traceback" in (tmp_path / "dagrl.log").read_text()


def test_cuda_oom_in_the_update_is_one_line(tmp_path):
    model = build_random_qwen3(
        str(tmp_path / "model"), 256, 2, 4, 2, 512, 151936, seed=1, init_std=0.2, max_positions=2048
    )
    rc, out, lines = run_main(
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "data.train_batch_size=32",
        "actor_rollout_ref.rollout.n=8",
        "data.max_response_length=1024",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=256",
        "trainer.gpu_memory_gib=4096",  # past the memory plan's refusal: the OOM must really happen
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.micro_batch_size_per_gpu=256",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    )
    print(out[-3000:])
    assert rc == 2, out[-3000:]
    line = lines[-1]
    assert line.startswith("error: CUDA out of memory: role train, rank 0"), line
    assert "DAG node actor_update (kind actor_update), phase train_step" in line, line
    assert "ppo_micro_batch_size_per_gpu (now 256)" in line, line
    assert line.endswith(f"full traceback in {tmp_path / 'run' / 'dagrl.log'}"), line
    assert "Traceback" not in out
    assert "OutOfMemoryError" in (tmp_path / "run" / "dagrl.log").read_text()
