"""Every multi-GPU acceptance row (bench/multi_gpu_rows.py) plans on the CPU: its exact command,
with config-only model shapes, dry-runs with rc 0 and plans the GPUs its CUDA_VISIBLE_DEVICES
gives it. A row that would die at start on the GPU machine (a refused layout, a key the YAML or
script does not take, a plan needing more cards than it is given) fails here instead."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tests.conftest import main_in_process
from tests.launch_scripts import dagrl_argv

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
import multi_gpu_rows  # noqa: E402


@pytest.fixture(scope="module")
def shapes(real_size_shapes):
    """model(shape) -> a config-only Qwen3 directory of that shape (a dry run reads no weights)."""
    return real_size_shapes.__getitem__


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    return multi_gpu_rows.gsm8k_data(str(tmp_path_factory.mktemp("gsm8k")))


def in_process_argv(cmd: list[str], env: dict, tmp_path) -> tuple[list[str], dict]:
    """The dagrl.main arguments `cmd` ends in: `env VAR=.. python -m dagrl.main ...` directly, a
    launch script (`env VAR=.. bash SCRIPT ...`) through tests/launch_scripts.py."""
    assert cmd[0] == "env"
    rest = cmd[1:]
    variables = {}
    while "=" in rest[0] and not rest[0].startswith("/"):
        key, _, value = rest.pop(0).partition("=")
        variables[key] = value
    if rest[1:3] == ["-m", "dagrl.main"]:
        return rest[3:], variables
    argv = dagrl_argv([*rest, "trainer.dry_run=true"], {**env, **variables}, tmp_path)
    return argv, variables


ALL_ROWS = {**multi_gpu_rows.ROWS, **multi_gpu_rows.PLAN_ONLY}


# the two-node row plans against a live cluster (trainer.ray_address=auto is probed before the plan):
# the session's Ray, used among the last tests (own_ray's order), when earlier tests have started it
# and no test that asserts Ray is not running comes after
ROW_PARAMS = [
    pytest.param(name, marks=pytest.mark.own_ray) if name.startswith("2n") else name for name in ALL_ROWS
]


@pytest.mark.parametrize("name", ROW_PARAMS)
def test_row_plans_its_gpus(shapes, gsm8k, tmp_path, monkeypatch, capsys, isolated_plugins, request, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # a slot's list would name its own cards
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cmd, env, _ = multi_gpu_rows.command(name, str(run_dir), shapes, gsm8k)
    argv, variables = in_process_argv(cmd, env, tmp_path)
    row = ALL_ROWS[name]
    assert variables["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(row.gpus)))
    argv = [a for a in argv if a != "trainer.dry_run=true"]
    if "trainer.ray_address=auto" in argv:  # on the GPU machine: the two raylets the group starts
        ray = request.getfixturevalue("ray_local")
        monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    if isinstance(row, multi_gpu_rows.ScriptRow) and row.run_dir:  # save/resume share a directory
        argv.append(f"trainer.default_local_dir={run_dir}")
    # the lent machine's host memory (a dry run elsewhere assumes none): a real run refuses more
    host = f"trainer.host_memory_gib={multi_gpu_rows.HOST_GIB[row.gpus]}"
    code, out = main_in_process(capsys, *argv, host, "trainer.dry_run=true")
    assert code == 0, out
    used = re.findall(r"^cluster: .*, (\d+) used$", out, re.M)
    assert used == [str(row.gpus)], out
    # every row's plan fits its cards (80 GiB; 141 for the 14B row) and its host
    assert "OVER" not in out and "warning:" not in out, out


def test_compare_reads_two_rows_step_by_step(tmp_path):
    """The save/resume and TP/one-GPU comparisons: steps both rows logged, the largest relative gap."""
    for name, grad in (("a", [1.0, 2.0]), ("b", [1.0, 2.2])):
        metrics = tmp_path / f"{name}.jsonl"
        metrics.write_text(
            "".join(json.dumps({"step": s + 1, "actor/grad_norm": g}) + "\n" for s, g in enumerate(grad))
        )
        (tmp_path / f"{name}.json").write_text(json.dumps({"metrics": str(metrics)}))
    result = multi_gpu_rows.compare(str(tmp_path), "a", "b")
    assert result["steps"] == [1, 2]
    assert result["max_rel_gap"] == {"actor/grad_norm": round(0.2 / 2.2, 4)}
    assert result["identical"] == {"actor/grad_norm": False}


def test_compare_reads_a_row_of_an_earlier_call_from_its_own_json(tmp_path):
    """pp compares with tp's one-GPU row and mega8b_resume with mega8b, often from a later call:
    a slot's TMPDIR (where the runs' metrics.jsonl lie) is emptied at the next call's start, so the
    row's JSON carries its compared steps (session 24's pp compare read no step of the 1g row)."""
    metrics = tmp_path / "slot_tmp" / "a.jsonl"
    metrics.parent.mkdir()
    metrics.write_text(
        "".join(json.dumps({"step": s, "actor/grad_norm": 0.5 * s, "other": 1}) + "\n" for s in (1, 2))
    )
    kept = {"metrics": str(metrics), "per_step": multi_gpu_rows.step_metrics(str(metrics))}
    (tmp_path / "a.json").write_text(json.dumps(kept))
    metrics.unlink()  # the next call's slot empties its TMPDIR
    later = tmp_path / "b.jsonl"
    later.write_text("".join(json.dumps({"step": s, "actor/grad_norm": 0.5 * s}) + "\n" for s in (1, 2)))
    (tmp_path / "b.json").write_text(json.dumps({"metrics": str(later)}))
    result = multi_gpu_rows.compare(str(tmp_path), "a", "b")
    assert result["steps"] == [1, 2] and result["identical"] == {"actor/grad_norm": True}
    assert result["rows"]["a"] == {1: {"actor/grad_norm": 0.5}, 2: {"actor/grad_norm": 1.0}}


def test_the_pp_row_reads_each_stage_beside_the_plan(
    shapes, gsm8k, tmp_path, monkeypatch, capsys, isolated_plugins
):
    """The PP2 row's dry run prints the update per stage; the row reads them beside the largest
    figure each stage's ranks logged (issue 34: per-stage memory against the plan)."""
    import gpu_matrix

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cmd, env, _ = multi_gpu_rows.command("2g-0.6b-megatron-pp2", str(run_dir), shapes, gsm8k)
    argv, _ = in_process_argv(cmd, env, tmp_path)
    code, out = main_in_process(
        capsys, *[a for a in argv if a != "trainer.dry_run=true"], "trainer.dry_run=true"
    )
    assert code == 0, out
    rows = [
        {"update/stage0_device_memory_used_gib": 55.1, "update/stage1_device_memory_used_gib": 50.2},
        {"update/stage0_device_memory_used_gib": 55.79, "update/stage1_device_memory_used_gib": 49.9},
    ]
    figures = gpu_matrix.stage_figures(out, rows)
    assert figures["peak"] == [55.79, 50.2]
    first, last = figures["plan"]
    assert first == gpu_matrix.plan_phases(out)["update"] > last  # two micro-batches in flight first
    # a run that logged the last stage alone (before every stage's cards were gathered): the figure
    # stays beside the last stage's plan, not the first's
    last_only = [{"update/stage1_device_memory_used_gib": 55.79}]
    assert gpu_matrix.stage_figures(out, last_only) == {"plan": [first, last], "peak": [None, 55.79]}
    assert gpu_matrix.stage_figures("", last_only) == {"plan": None, "peak": [None, 55.79]}  # no dry run
    assert (
        gpu_matrix.stage_figures("    update  12.00  = ...", [{"update/device_memory_used_gib": 9.0}]) is None
    )
