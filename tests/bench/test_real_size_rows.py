"""The one-GPU matrix rows (bench/gpu_matrix.py ROWS, through bench/real_size_gpu.py) on the CPU:
their prompts are exactly the row's prompt length (the plan counts data.max_prompt_length for every
prompt, so a row of shorter prompts measures less than the plan says it holds), and each row's
command dry-runs with rc 0 and prints the per-phase plan the row reads."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import main_in_process

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_matrix  # noqa: E402
import real_size_gpu  # noqa: E402


@pytest.fixture(scope="module")
def shapes(real_size_shapes):
    return real_size_shapes


def test_prompts_are_exactly_the_rows_length(shapes, tmp_path):
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.parquet import PromptDataset

    path = real_size_gpu.full_length_prompts(shapes["0.6b"], str(tmp_path), 160, 48)
    tokenizer = load_tokenizer(shapes["0.6b"])
    dataset = PromptDataset(path, tokenizer, max_prompt_length=160)
    assert len(dataset) == 48 and dataset.num_filtered == 0
    lengths = {len(dataset[i].prompt_ids) for i in range(len(dataset))}
    assert lengths == {160}
    # every prompt its own after the chat template's header: vLLM's prefix cache shares no more
    tails = {tuple(dataset[i].prompt_ids[-100:]) for i in range(len(dataset))}
    assert len(tails) == 48
    # the problem and its answer are the built-in one's: the filler follows the question
    import pyarrow.parquet as pq

    from dagrl.data.builtin import generate_rows

    written = pq.read_table(path).to_pylist()
    for row, plain in zip(written, generate_rows("train", 48, seed=1, teacher_prompts=False)):
        assert row["prompt"][0]["content"].startswith(plain["prompt"][0]["content"])
        assert row["reward_model"]["ground_truth"] == plain["reward_model"]["ground_truth"]
    # written once: a save/resume pair that shares its run directory reads the same rows
    stamp = os.path.getmtime(path)
    assert real_size_gpu.full_length_prompts(shapes["0.6b"], str(tmp_path), 160, 48) == path
    assert os.path.getmtime(path) == stamp


def test_the_shapes_tokenizer_takes_the_shapes_positions(shapes):
    """The shipped tokenizer's 64-position limit is the tiny model's: a shape's copy says the
    shape's, so a 128-token prompt draws no "indexing errors" warning from transformers."""
    import json

    from dagrl.backends.hf_model import load_tokenizer

    with open(os.path.join(shapes["0.6b"], "config.json")) as f:
        positions = json.load(f)["max_position_embeddings"]
    assert positions > 64
    assert load_tokenizer(shapes["0.6b"]).model_max_length == positions


def test_a_prompt_length_below_the_question_is_refused(shapes, tmp_path):
    with pytest.raises(ValueError, match="exactly 5 tokens"):
        real_size_gpu.full_length_prompts(shapes["0.6b"], str(tmp_path), 5, 4)


def test_rows_given_their_own_data_keep_it(shapes, tmp_path):
    args = SimpleNamespace(setup="torch", prompts=4, n=2, prompt=64, response=32, steps=2,
                           overrides=["data.train_files=/data/own.parquet"])  # fmt: skip
    keys = real_size_gpu.overrides(args, shapes["0.6b"], str(tmp_path), "plugin.py")
    assert [k for k in keys if k.startswith("data.train_files=")] == ["data.train_files=/data/own.parquet"]
    assert not list(tmp_path.glob("prompts_*.parquet"))


@pytest.mark.parametrize("name", sorted(gpu_matrix.ROWS))
def test_matrix_row_plans_on_its_card(shapes, tmp_path, monkeypatch, capsys, isolated_plugins, name):
    """The row's command as bench/gpu_matrix.py runs it, dry: the H200 the record runs it on (and
    the lent machines' host memory), its prompts file named and whole."""
    shape, _, prompts, _, prompt, _, steps = gpu_matrix.ROWS[name]
    monkeypatch.chdir(tmp_path)
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    keys = gpu_matrix.overrides(
        shapes[shape], run_dir, str(tmp_path / "long_answer.py"), gpu_matrix.ROWS[name]
    )
    (tmp_path / "long_answer.py").write_text(real_size_gpu.REWARD)
    data = [k.split("=", 1)[1] for k in keys if k.startswith("data.train_files=")]
    assert data == [os.path.join(run_dir, f"prompts_{prompt}.parquet")] and os.path.isfile(data[0])
    code, out = main_in_process(
        capsys, *keys, "trainer.dry_run=true", "trainer.gpu_memory_gib=139.8", "trainer.host_memory_gib=500"
    )
    assert code == 0, out
    phases = gpu_matrix.plan_phases(out)
    assert phases.get("rollout", 0) > 0 and phases.get("update", 0) > 0, out
    assert "OVER" not in out, out
    # bench/acceptance_slots.py runs one host-heavy row a call: the set is the plans'
    assert (gpu_matrix.plan_host_gib(out) >= 32) == (name in gpu_matrix.HOST_HEAVY), out


def test_8b_torch_needs_a_host_of_more_than_one_h200s_memory(shapes, tmp_path, monkeypatch):
    """Issue 29's 8B torch row runs "where host memory allows, else refused before Ray with the host
    figures": its plan keeps the optimizer's fp32 state and the sleeping engine's weights on the host
    (159.3 GiB: 91.5 pageable, 45.8 in pinned slabs, 22.0 the engine's pinned copy of its weights and
    sampler tables; a 2 x H200 run read 161.8, 2026-11-28), over 90 % of a one-H200
    machine's 128 GiB (a real run refuses it before Ray, naming the figures and the levers), within
    a 4-GPU host's 512 GiB."""
    from dagrl.errors import ConfigError
    from dagrl.trainer.capacity import check_host_memory
    from dagrl.trainer.setup import prepare
    from tests.conftest import compose_config

    monkeypatch.chdir(tmp_path)
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    (tmp_path / "long_answer.py").write_text(real_size_gpu.REWARD)
    row = gpu_matrix.ROWS["8b-torch"]
    keys = gpu_matrix.overrides(shapes["8b"], run_dir, str(tmp_path / "long_answer.py"), row)

    def planned(host_gib: int):
        return prepare(
            compose_config(
                *keys,
                "trainer.dry_run=true",
                "trainer.gpu_memory_gib=139.8",
                f"trainer.host_memory_gib={host_gib}",
            )  # fmt: skip
        )

    one_card = planned(128)
    [warning] = one_card.warnings
    assert "GiB in host memory on node 0 (train 137.32 + rollout 21.97)" in warning, warning
    one_card.cfg.trainer.dry_run = False
    with pytest.raises(ConfigError) as refused:
        check_host_memory(one_card.cfg, one_card.memory)
    assert refused.value.key == "trainer.host_memory_gib" and "of its 128 GiB" in str(refused.value)
    assert planned(512).warnings == ()


def test_a_card_row_plans_for_the_smaller_card(shapes, tmp_path, monkeypatch, capsys, isolated_plugins):
    """CARD_ROWS: 4b-megatron as on an H100 80 GB, run on an H200 with trainer.gpu_memory_gib=79.2
    and a ballast holding the rest: its command is the 4b-megatron row's with that figure, and the
    plan chooses for 79.2 GiB what it does not for the H200's 139.8 (megatron's CPU optimizer:
    the path this row exists to run on a card)."""
    monkeypatch.chdir(tmp_path)
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    monkeypatch.setattr(gpu_matrix, "build", lambda root, shape: shapes[shape])  # the shape, weightless
    cmd, _, _ = gpu_matrix.row_command("4b-megatron-80gib", run_dir)
    base, _, _ = gpu_matrix.row_command("4b-megatron", run_dir)
    assert cmd == base + ["trainer.gpu_memory_gib=79.2"]
    keys = cmd[3:]  # after `python -m dagrl.main`
    offload = "actor_rollout_ref.actor.megatron.optimizer_cpu_offload: auto -> "
    for card, host in (("79.2", "true"), ("139.8", "false")):
        code, out = main_in_process(capsys, *keys, "trainer.dry_run=true", f"trainer.gpu_memory_gib={card}")
        assert code == 0 and "OVER" not in out, out
        assert (offload + "true" in out) == (host == "true"), out
        assert (gpu_matrix.plan_host_gib(out) >= 32) == (host == "true"), out
    assert "4b-megatron-80gib" in gpu_matrix.HOST_HEAVY


def test_a_card_rows_device_figures_are_read_less_its_ballast():
    """The run reads the whole device's use (total - free), the ballast's allocation included: the
    row's figures leave it out; the allocator's own figures never held it."""
    rows = [{"update/device_memory_used_gib": 80.5, "memory/to_rollout/in_use_gib": 70.0,
             "memory/to_rollout/allocated_gib": 5.0, "update/stage0_device_memory_used_gib": 81.0,
             "timing_s/step": 3.0}]  # fmt: skip
    [row] = gpu_matrix.less_held(rows, 60.5)
    assert row == {"update/device_memory_used_gib": 20.0, "memory/to_rollout/in_use_gib": 9.5,
                   "memory/to_rollout/allocated_gib": 5.0, "update/stage0_device_memory_used_gib": 20.5,
                   "timing_s/step": 3.0}  # fmt: skip


def test_the_8b_megatron_row_plans_with_its_hosts_memory(
    shapes, tmp_path, monkeypatch, capsys, isolated_plugins
):
    """The 8B megatron row's optimizer share on the host follows the host: all of it on a large one,
    0.6 on a one-H200 machine's 126 GiB (the device then holds the rest: 122.8 GiB planned in its
    rollout, and 124.3 read there, 2026-11-29). The row's dry run takes this machine's memory as
    the real run does (gpu_matrix.this_host), so the plan column is the plan the run ran."""
    monkeypatch.chdir(tmp_path)
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    monkeypatch.setattr(gpu_matrix, "build", lambda root, shape: shapes[shape])  # the shape, weightless
    cmd, _, _ = gpu_matrix.row_command("8b-megatron", run_dir)
    [given] = gpu_matrix.this_host(cmd)
    assert given.startswith("trainer.host_memory_gib=") and float(given.split("=")[1]) > 1, given
    assert gpu_matrix.this_host(cmd + ["trainer.host_memory_gib=500"]) == []
    share = "actor_rollout_ref.actor.megatron.optimizer_offload_fraction: auto -> "
    for host, fraction, rollout, on_host in (("500", "1.0", 86.16, 157.29), ("126", "0.6", 122.77, 103.83)):
        keys = cmd[3:] + [
            "trainer.dry_run=true",
            "trainer.gpu_memory_gib=139.8",
            f"trainer.host_memory_gib={host}",
        ]
        code, out = main_in_process(capsys, *keys)
        assert code == 0 and "OVER" not in out, out
        # the note names a share below 1.0 (1.0 is the default, said by no note)
        assert (share + fraction in out) if fraction != "1.0" else (share not in out), out
        assert gpu_matrix.plan_phases(out)["rollout"] == pytest.approx(rollout, abs=0.01), out
        assert gpu_matrix.plan_host_gib(out) == pytest.approx(on_host, abs=0.01), out
