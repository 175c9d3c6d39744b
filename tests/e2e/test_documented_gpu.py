"""The GPU-only commands README.md and docs/*.md show, run end to end on the GPU machine (the CPU
suite plans them: test_documented_commands.py::test_gpu_command_plans). Each runs as a user types
it, from a directory outside the checkout, in a process of its own, for two steps (the second
wakes what the first put to sleep), with its placeholders replaced by stand-ins: a random-weight
Qwen3-0.6B shape for every model path and the gsm8k fixture as data. A command written for more
GPUs than the machine has runs at the machine's count (`trainer.n_gpus_per_node`); one whose model
parallelism needs more cards than that is skipped, naming them (it runs on a machine that size).
Documented dry runs (`trainer.dry_run=true`) run as written: the plan against the real card."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.docs.commands import ROOT
from tests.e2e.test_documented_commands import gpu_commands, stand_in_argv

pytestmark = pytest.mark.gpu

TWO_STEPS = [
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=2",
    "trainer.save_freq=-1",
    "trainer.progress_bar=false",
    "trainer.logger=[console]",
]
# the fewest prompts every documented batch divides into (a verl mini-batch of 16), n left as written
SMALL_BATCH = ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
PARALLEL = re.compile(r"(tensor|pipeline|context)_model_parallel_size=(\d+)")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """A Qwen3-0.6B shape with random weights (tools/random_qwen3.py) and the gsm8k fixture."""
    sys.path.insert(0, str(ROOT))
    from tests.data_preprocess.test_scripts import gsm8k_parquet
    from tools.random_qwen3 import build_random_qwen3

    root = tmp_path_factory.mktemp("stand_ins")
    build_random_qwen3(str(root / "model"), 1024, 28, 16, 8, 3072, 151936, head_dim=128)
    gsm8k_parquet(root)
    return root


def sized_to_this_machine(argv: list[str], cards: int) -> list[str]:
    """`trainer.n_gpus_per_node=N` above the machine's count becomes that count."""
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "trainer.n_gpus_per_node" and value.isdigit() and int(value) > cards:
            arg = f"{key}={cards}"
        out.append(arg)
    return out


def shard(commands: list[str]) -> list[str]:
    """DOCS_GPU_SHARD=i/n: every n-th command from the i-th (one acceptance call each: a vLLM
    engine's start takes a minute and a half on a fresh machine)."""
    i, _, n = os.environ.get("DOCS_GPU_SHARD", "0/1").partition("/")
    return commands[int(i) :: int(n)]


@pytest.mark.parametrize("command", shard(gpu_commands()))
def test_gpu_command_runs(stand_ins, tmp_path, command):
    import torch

    cards = torch.cuda.device_count()
    needed = 1
    for _, size in PARALLEL.findall(command):
        needed *= int(size)
    if needed > cards:
        pytest.skip(f"model parallelism of {needed} GPUs on a machine of {cards}")
    argv = sized_to_this_machine(stand_in_argv(command, stand_ins), cards)
    dry = "trainer.dry_run=true" in argv
    extra = [] if dry else [*TWO_STEPS, *SMALL_BATCH]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "dagrl.main", *argv, *extra, f"trainer.default_local_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = proc.stdout + proc.stderr
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    if dry:
        assert "dry run: plan printed" in out, out[-2000:]
    else:
        assert (tmp_path / "run" / "metrics.jsonl").is_file(), out[-2000:]
        steps = (tmp_path / "run" / "metrics.jsonl").read_text().count('"step"')
        assert steps >= 2, out[-2000:]
