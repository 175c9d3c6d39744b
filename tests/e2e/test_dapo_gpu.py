"""DAPO on one GPU with the vLLM engine colocated with the trainer (the shipped tiny model): steps
that sample more than one round reuse the engine's weights of that step (no second sync), and the
policy still answers as well as before (weights an engine dropped while asleep would not).

Each sleep level is a run of its own (`python -m dagrl.main`: Ray, a worker, an engine). The engine
starts eager: a compiled one spent ~70 s of each run compiling and capturing graphs, which this
test does not look at (tests/backends/vllm/test_vllm_gpu.py runs the compiled engine through
sleep and refresh). Two steps: the first samples several rounds (with two responses a prompt,
about half the groups get equal rewards), the second wakes the engine from the sleep after the
first update and refreshes it, and validation runs before and after both.

Run on the GPU machine: python -m pytest -m gpu -q tests/e2e/test_dapo_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.gpu_runs import REPO, cli_env, failure, run_cli

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

R = "actor_rollout_ref.rollout"


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_dapo_rounds_on_vllm(tmp_path, sleep_level):
    pytest.importorskip("vllm")
    args = ["algorithm=dapo", "trainer.device=cuda", f"{R}.name=vllm", f"{R}.gpu_memory_utilization=0.1"]
    args += [f"{R}.enforce_eager=true", f"{R}.sleep_level={sleep_level}", f"{R}.n=2"]
    args += ["algorithm.filter_groups.max_num_gen_batches=4", "trainer.total_training_steps=2"]
    args += ["trainer.test_freq=2", "trainer.logger=[console]", "trainer.progress_bar=false"]
    args += [f"trainer.default_local_dir={tmp_path}"]
    proc = run_cli(args, cwd=REPO, env=cli_env(), timeout=180)
    assert proc.returncode == 0, failure(proc)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    steps = [r for r in rows if r["step"] > 0]
    assert max(r["dynamic_sampling/rounds"] for r in steps) >= 2  # the refill ran
    before, after = rows[0]["val/reward/mean"], rows[-1]["val/reward/mean"]
    assert after > before - 0.1, f"validation reward {before:.3f} -> {after:.3f}: the engine's weights?"
