"""The commands README.md and docs/*.md show, run as a new user would: from a directory outside
the checkout (the test's tmp_path), in process on the session's Ray. CPU commands run end to end
for one step that passes through every node of their DAG and its validation DAG; GPU-only ones
(vLLM, cuda, megatron on 8 GPUs) plan with trainer.dry_run=true. tests/docs/test_documented.py
fails when a documented command has no test here or elsewhere."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.conftest import main_in_process
from tests.docs.commands import ROOT

# one step of the fewest rows through every node, validation included, no progress bar
ONE_STEP = [
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=1",
    "data.builtin_val_rows=1",
    "trainer.progress_bar=false",
    "trainer.logger=[console]",
]
SMALL_BATCH = [
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
]

# documented CPU command -> what makes it one short step (appended after the command's own keys)
CPU_COMMANDS = {
    # a tool call, its observation and the answer: two assistant turns
    "python -m dagrl.main experiment=multi_turn/calculator": [
        *ONE_STEP,
        "data.train_batch_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=1",
    ],
    "python -m dagrl.main algorithm=opsd teacher.model=self": [*ONE_STEP, *SMALL_BATCH],
}


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_from(tmp_path, monkeypatch, capsys, command: str, *extra: str) -> tuple[int, str]:
    """`command` (with `extra` keys) run by main in process from `tmp_path`, writing there."""
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[3:]
    return main_in_process(capsys, *argv, *extra, f"trainer.default_local_dir={tmp_path / 'run'}")


@pytest.mark.parametrize("command", list(CPU_COMMANDS))
def test_cpu_command_runs_from_any_directory(ray_local, tmp_path, monkeypatch, capsys, command):
    code, out = run_from(tmp_path, monkeypatch, capsys, command, *CPU_COMMANDS[command])
    assert code == 0, out
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1] and "val/reward/mean" in rows[-1], rows
    assert "Traceback" not in out


# documented commands that other tests run (test ids); every other documented command that is not
# in CPU_COMMANDS is a GPU command and plans with trainer.dry_run=true below
ELSEWHERE = {
    "python -m dagrl.main": "tests/e2e/test_grpo_run.py::test_default_run_learns",
    "python -m dagrl.main --help": (
        "tests/config/test_compat.py::test_help_lists_groups_and_every_key_with_type_default_and_meaning"
    ),
    "python -m dagrl.main --cfg job": "tests/config/test_config.py::test_cfg_job_prints_resolved_config",
    "python -m dagrl.main algorithm=gkd": "tests/e2e/test_gkd_run.py::test_default_gkd_run_learns",
    "python -m dagrl.main algorithm=opsd": "tests/e2e/test_opsd_run.py::test_default_opsd_run_learns",
    "python -m dagrl.main algorithm=sft actor_rollout_ref.model.path=/tmp/fresh"
    " actor_rollout_ref.actor.optim.lr=3e-3 actor_rollout_ref.actor.optim.lr_warmup_steps=10"
    " data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=64"
    " actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 data.builtin_val_rows=128"
    " trainer.total_training_steps=400 trainer.test_freq=100": (
        "tests/e2e/test_sft_run.py::test_sft_from_scratch_raises_greedy_accuracy"
    ),
    "python -m dagrl.main 'external_plugins=[my_rewards.py]' 'reward.functions=[{name: exact_answer}]'": (
        "tests/e2e/test_loggers_run.py::test_a_step_twice_with_wandb_offline_and_a_trl_reward"
    ),
    "python -m dagrl.main custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score"
    " +custom_reward_function.reward_kwargs.format_score=0.1": (
        "tests/e2e/test_verl_reward_run.py::test_a_verl_compute_score_file_scores_a_real_step"
    ),
    "python -m dagrl.main actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32"
    " actor_rollout_ref.actor.optim.lr=1e-3": "tests/e2e/test_lora_run.py::test_lora_run_takes_its_reference_from_the_base",
    "python -m dagrl.main algorithm=dapo": "tests/e2e/test_dapo_run.py::test_dapo_refills_the_batch",
    "python -m dagrl.main actor_rollout_ref.model.use_remove_padding=true": (
        "tests/e2e/test_packing_run.py::test_packed_run_follows_the_padded_run"
    ),
    # the forms of a user's own file (--config, run.sh) and run.sh's GPU check
    "python -m dagrl.main --config my.yaml [overrides...]": (
        "tests/config/test_config_file.py::test_a_users_edited_yaml_runs_its_own_settings_and_overrides_come_after"
    ),
    "bash run_scripts/gkd/run.sh my.yaml": (
        "tests/config/test_config_file.py::test_run_sh_runs_the_users_file_not_the_preset_of_that_name"
    ),
    "bash run_scripts/gkd/run.sh <preset> [overrides]": (
        "tests/config/test_teacher_standalone.py::test_run_sh_says_how_many_gpus_the_placement_needs"
    ),
    "bash run_scripts/gkd/run.sh examples/ms_swift/rollout_separate_teacher_colocate.yaml"
    " model=/models/Qwen3-0.6B teacher_model=/models/Qwen3-1.7B data.train_files=~/data/gsm8k/train.parquet": (
        "tests/config/test_config_file.py::test_shipped_ms_swift_gkd_yaml_plans_like_its_preset"
    ),
}


def gpu_commands() -> list[str]:
    from tests.docs.commands import documented_commands

    return [c for c in documented_commands() if c not in CPU_COMMANDS and c not in ELSEWHERE]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """A Qwen3-0.6B-shape model directory (config only: a dry run reads no weights) and gsm8k
    parquet from examples/data_preprocess/gsm8k.py on the fixture rows (repeated to fill 64)."""
    from transformers import Qwen3Config

    from tests.data_preprocess.test_scripts import gsm8k_parquet

    root = tmp_path_factory.mktemp("stand_ins")
    Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
    ).save_pretrained(root / "model")
    gsm8k_parquet(root)
    return root


def stand_in_argv(command: str, root) -> list[str]:
    """The command's arguments with its placeholders (model directories, data files, `...`) replaced
    by stand-ins, and paths into the checkout (examples/) made absolute."""
    argv = []
    for arg in shlex.split(command.replace("<Qwen3-0.6B dir>", "MODEL"))[3:]:
        key, _, value = arg.partition("=")
        if arg == "...":
            continue
        if key.endswith("model.path") or key in ("teacher.model", "model", "teacher_model"):
            arg = f"{key}={root / 'model'}"
        elif key in ("data.train_files", "data.val_files"):
            arg = f"{key}={root / 'gsm8k' / ('train' if 'train' in key else 'test')}.parquet"
        elif arg.startswith("examples/"):
            arg = str(ROOT / arg)
        argv.append(arg)
    return argv


@pytest.mark.parametrize("command", gpu_commands())
def test_gpu_command_plans(stand_ins, tmp_path, monkeypatch, capsys, isolated_plugins, command):
    """What a GPU command would run, planned on this machine: every rule, the placement, the DAG."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    argv = [*stand_in_argv(command, stand_ins), "trainer.dry_run=true"]
    code, out = main_in_process(capsys, *argv, f"trainer.default_local_dir={tmp_path / 'run'}")
    assert code == 0, out
    assert "dry run: plan printed" in out and " GPU" in out, (
        f"{command!r} plans no GPU run: run it end to end (CPU_COMMANDS) or name its test (ELSEWHERE)"
    )


def test_vllm_script_plans_from_any_directory(stand_ins, tmp_path, monkeypatch, capsys):
    """run_scripts/run_qwen3-0.6b-vllm.sh with DRY_RUN=1 (its header's command): the one-GPU vLLM
    plan for a Qwen3-0.6B-shape model on gsm8k parquet, the command the script builds planned in
    process from a directory outside the checkout."""
    import os

    from tests.launch_scripts import dagrl_argv

    env = {
        **os.environ,
        "MODEL_PATH": str(stand_ins / "model"),
        "TRAIN_FILE": str(stand_ins / "gsm8k" / "train.parquet"),
        "VAL_FILE": str(stand_ins / "gsm8k" / "test.parquet"),
        "DRY_RUN": "1",
    }
    script = ROOT / "run_scripts" / "run_qwen3-0.6b-vllm.sh"
    argv = dagrl_argv(
        ["bash", str(script), f"trainer.default_local_dir={tmp_path / 'run'}"], env, tmp_path, tmp_path
    )
    monkeypatch.chdir(tmp_path)
    code, out = main_in_process(capsys, *argv)
    assert code == 0, out
    assert "cluster: 1 node(s) × 1 GPU(s), 1 used" in out and "rollout engine vllm" in out, out
    assert "dry run: plan printed, no workers started" in out
