"""DAPO on one GPU with the vLLM engine colocated with the trainer (the shipped tiny model): steps
that sample more than one round reuse the engine's weights of that step (no second sync), and the
policy still answers as well as before (weights an engine dropped while asleep would not).

Run on the GPU machine: python -m pytest -m gpu -q tests/e2e/test_dapo_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_dapo_rounds_on_vllm(tmp_path, sleep_level):
    pytest.importorskip("vllm")
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    cmd = [sys.executable, "-m", "dagrl.main", "algorithm=dapo", "trainer.device=cuda"]
    cmd += ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    cmd += [f"actor_rollout_ref.rollout.sleep_level={sleep_level}", "actor_rollout_ref.rollout.n=2"]
    cmd += ["algorithm.filter_groups.max_num_gen_batches=4", "trainer.total_training_steps=3"]
    cmd += ["trainer.test_freq=3", "trainer.logger=[console]", "trainer.progress_bar=false"]
    cmd += [f"trainer.default_local_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    steps = [r for r in rows if r["step"] > 0]
    assert max(r["dynamic_sampling/rounds"] for r in steps) >= 2  # the refill ran
    before, after = rows[0]["val/reward/mean"], rows[-1]["val/reward/mean"]
    assert after > before - 0.1, f"validation reward {before:.3f} -> {after:.3f}: the engine's weights?"
