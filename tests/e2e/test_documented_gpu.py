"""The GPU-only commands README.md and docs/*.md show, run end to end on the GPU machine (the CPU
suite plans them: test_documented_commands.py::test_gpu_command_plans). Each runs as a user types
it, from a directory outside the checkout, in a process of its own, for two steps (the second
wakes what the first put to sleep), with its placeholders replaced by stand-ins: a random-weight
Qwen3-0.6B shape for every model path and the gsm8k fixture as data. A command written for more
GPUs than the machine has runs at the machine's count (`trainer.n_gpus_per_node`); one whose model
parallelism needs more cards than that is skipped, naming them (it runs on a machine that size).
A command the documents write after `CUDA_VISIBLE_DEVICES=0,1` runs on the first two cards this
process was given (on a shared host physical cards 0 and 1 may be another test's), or is skipped
when it was given fewer. Documented dry runs (`trainer.dry_run=true`) run as written: the plan
against the real card. The engines start as users get them (compiled, CUDA graphs): this file and
tests/trainer/test_handover_gpu.py are where the default engine runs end to end."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from tests.docs.commands import ROOT, documented_env
from tests.e2e.test_documented_commands import gpu_commands, stand_in_argv
from tests.gpu_runs import cli_env, run_cli, visible_cards

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

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


def command_env(command: str) -> tuple[dict[str, str], int]:
    """(the environment `command` runs in, its card count): this process's, with the variables the
    documents set before the command; a documented CUDA_VISIBLE_DEVICES of N cards names the first
    N cards this process was given (skipped when it was given fewer)."""
    documented, cards = documented_env(command), visible_cards()
    env = cli_env(**documented)
    if "CUDA_VISIBLE_DEVICES" in documented:
        wanted = [c for c in documented["CUDA_VISIBLE_DEVICES"].split(",") if c.strip()]
        if len(wanted) > len(cards):
            pytest.skip(
                f"written for CUDA_VISIBLE_DEVICES={','.join(wanted)}; this process has {len(cards)} card(s)"
            )
        cards = cards[: len(wanted)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(cards)
    return env, len(cards)


@pytest.mark.parametrize("command", shard(gpu_commands()))
def test_gpu_command_runs(stand_ins, tmp_path, command):
    env, cards = command_env(command)
    needed = 1
    for _, size in PARALLEL.findall(command):
        needed *= int(size)
    if needed > cards:
        pytest.skip(f"model parallelism of {needed} GPUs on a machine of {cards}")
    argv = sized_to_this_machine(stand_in_argv(command, stand_ins), cards)
    dry = "trainer.dry_run=true" in argv
    extra = [] if dry else [*TWO_STEPS, *SMALL_BATCH]
    proc = run_cli(
        [*argv, *extra, f"trainer.default_local_dir={tmp_path / 'run'}"],
        cwd=str(tmp_path),
        env=env,
        timeout=280,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    if dry:
        assert "dry run: plan printed" in out, out[-2000:]
    else:
        assert (tmp_path / "run" / "metrics.jsonl").is_file(), out[-2000:]
        steps = (tmp_path / "run" / "metrics.jsonl").read_text().count('"step"')
        assert steps >= 2, out[-2000:]
