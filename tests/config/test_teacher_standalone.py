"""A standalone (vLLM) teacher's rules, the three GKD placement presets and their launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dagrl.backends.vllm.rules import check_teacher_device
from dagrl.config.placement import format_plan
from dagrl.errors import ConfigError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config, main_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = {
    # name: (groups of the 2-GPU plan, GPUs used)
    "rollout_colocate_teacher_colocate": ([["train", "rollout", "teacher"]], 1),
    "rollout_separate_teacher_colocate": ([["train", "teacher"], ["rollout"]], 2),
    "rollout_colocate_teacher_standalone": ([["train", "rollout"], ["teacher"]], 2),
}
STANDALONE = "experiment=gkd/rollout_colocate_teacher_standalone"


def dry(*overrides: str):
    return prepare(compose_config(*overrides, "trainer.dry_run=true"))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_dry_runs_on_a_declared_gpu_cluster(name):
    prepared = dry(f"experiment=gkd/{name}")
    plan = prepared.plan
    groups, used = PRESETS[name]
    assert plan.device == "cuda" and [g.roles for g in plan.groups] == groups
    assert plan.total_slots == used
    assert prepared.cfg.actor_rollout_ref.rollout.name == "vllm"
    # per-GPU estimates for the student, the rollout and the teacher (the shipped tiny models):
    # what each keeps on its device between phases, and in host memory (an offloaded teacher)
    assert set(plan.memory_gib) == {"train", "rollout", "teacher"}
    assert all(plan.memory_gib[r] + plan.offloaded_gib.get(r, 0) > 0 for r in plan.memory_gib)
    text = format_plan(plan)
    assert "teacher: 1 workers" in text and "GiB/device" in text


def test_preset_scales_to_more_gpus_and_replicas():
    plan = dry(
        STANDALONE, "trainer.n_gpus_per_node=8", "teacher.gpus=4", "teacher.tensor_model_parallel_size=2"
    ).plan
    t = plan.roles["teacher"]
    assert (t.workers, t.tp, t.dp) == (4, 2, 2)  # two replicas share the requests
    assert len(plan.group_of("train").slots) == 4
    # a standalone teacher's engine takes its share of each of its cards, whatever its TP size
    # (vLLM's gpu_memory_utilization; the memory plan's table, from the engine's own estimate)
    assert (
        plan.memory_gib["teacher"] == dry(STANDALONE).plan.memory_gib["teacher"] == pytest.approx(0.85 * 80)
    )


def test_teacher_weights_are_counted_with_the_teachers_own_model():
    prepared = dry("experiment=gkd/rollout_separate_teacher_colocate")
    from dagrl.backends.model_shape import read_model_shape
    from dagrl.backends.torch.memory import offload_pinned_bytes
    from dagrl.trainer.setup import _count_params

    params, _ = _count_params(prepared.cfg, prepared.cfg.teacher.model)
    # teacher.offload: its bf16 weights wait in host memory between its forwards, in pinned slabs
    # (backends/pinned.py: a power of two below 1 MiB, as this tiny teacher's are)
    teacher = read_model_shape(prepared.cfg.teacher.model)
    assert teacher.params == params
    pinned = offload_pinned_bytes(teacher, 2, optimizer=False)
    assert params * 2 <= pinned < 2 * params * 2 + 2**20
    assert prepared.plan.offloaded_gib["teacher"] == pytest.approx(pinned / 2**30)
    assert prepared.plan.memory_gib["teacher"] == 0


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algorithm.gkd.gkd_logits_topk=null"], "algorithm.gkd.gkd_logits_topk"),
        (["algorithm.gkd.gkd_logits_topk=100"], "teacher.engine_kwargs.max_logprobs"),
        (["teacher.engine_kwargs.max_logprobs=10"], "teacher.engine_kwargs.max_logprobs"),
        (["+teacher.engine_kwargs.seed=3"], "teacher.engine_kwargs.seed"),
        (["+teacher.engine_kwargs.logprobs_mode=raw_logits"], "teacher.engine_kwargs.logprobs_mode"),
        (["+teacher.engine_kwargs.max_model_len=16"], "teacher.engine_kwargs.max_model_len"),
        (["placement.colocate_groups=[[train,rollout,ref,teacher]]"], "placement.colocate_groups"),
        (["placement.gpus.teacher=2", "teacher.gpus=1"], "placement.gpus.teacher"),
        (["teacher.gpus=3", "trainer.n_gpus_per_node=4"], "data.train_batch_size"),  # 64 rows / 3 replicas
    ],
)
def test_standalone_teacher_rules_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as exc:
        dry(STANDALONE, *overrides)
    assert exc.value.key == key, exc.value


def test_max_logprobs_unlimited_is_accepted():
    dry(STANDALONE, "algorithm.gkd.gkd_logits_topk=100", "teacher.engine_kwargs.max_logprobs=-1")


@pytest.mark.parametrize(
    "overrides",
    [
        ["placement.gpus.teacher=1", "trainer.n_gpus_per_node=2"],
        ["placement.colocate_groups=[[train,rollout,ref],[teacher]]", "trainer.n_gpus_per_node=2"],
    ],
)
def test_colocated_teacher_with_a_teacher_group_of_its_own_is_refused(overrides):
    with pytest.raises(ConfigError) as exc:
        dry("experiment=gkd/rollout_colocate_teacher_colocate", *overrides)
    assert exc.value.key == "teacher.placement" and "two teachers" in exc.value.fix


def _device_groups(teacher_ranks: list[int], teacher_workers: list[str]) -> str:
    groups = {
        "nproc_per_node": 2,
        "actor": {"device": "GPU", "ranks": [0], "workers": ["train", "rollout", "ref"]},
        "teacher": {"device": "GPU", "ranks": teacher_ranks, "workers": teacher_workers},
    }
    return f"placement.device_groups='{json.dumps(groups)}'"


def test_device_groups_form_of_the_teacher_group():
    plan = dry(STANDALONE, _device_groups([1], ["teacher"])).plan
    assert plan.group_of("teacher").roles == ["teacher"] and plan.group_of("teacher").slots == [1]
    with pytest.raises(ConfigError) as exc:  # ms-swift's form with a colocated teacher: two teachers
        dry(
            "experiment=gkd/rollout_colocate_teacher_colocate",
            "trainer.n_gpus_per_node=2",
            _device_groups([1], ["teacher"]),
        )
    assert exc.value.key == "teacher.placement"


def test_standalone_teacher_needs_a_gpu_to_run():
    cfg = compose_config(STANDALONE, "trainer.device=cpu", "teacher.model=/t")
    with pytest.raises(ConfigError) as exc:
        check_teacher_device(cfg, "cpu")
    assert exc.value.key == "teacher.placement"
    cfg.trainer.dry_run = True
    check_teacher_device(cfg, "cpu")  # a plan needs no GPU


def _run_sh(*args: str, visible: str | None):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHON"] = sys.executable
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.run(
        ["bash", os.path.join(ROOT, "run_scripts/gkd/run.sh"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_run_sh_says_how_many_gpus_the_placement_needs():
    out = _run_sh(
        "rollout_colocate_teacher_standalone", "teacher.gpus=2", "trainer.n_gpus_per_node=3", visible="0,1"
    )
    assert out.returncode == 1
    assert "needs 3 GPU(s)" in out.stderr and "CUDA_VISIBLE_DEVICES=0,1 exposes 2" in out.stderr


def test_run_sh_plans_a_preset_without_gpus(tmp_path, capsys):
    """trainer.dry_run=true needs no GPU (none visible): run.sh hands the preset to dagrl as is."""
    from tests.launch_scripts import dagrl_argv

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = ["bash", os.path.join(ROOT, "run_scripts/gkd/run.sh"), "gkd/rollout_colocate_teacher_colocate.yaml"]
    argv = dagrl_argv([*cmd, "trainer.dry_run=true"], env, tmp_path, ROOT)
    assert argv[0] == "experiment=gkd/rollout_colocate_teacher_colocate", argv
    code, out = main_in_process(capsys, *argv, f"trainer.default_local_dir={tmp_path}")
    assert code == 0 and "dry run: plan printed" in out, out


def test_train_devices_are_handed_over_during_standalone_scoring_only():
    standalone = dry(STANDALONE).dag
    assert standalone.deps["handover"] == {"rollout"}  # alongside teacher_logprob and reward
    assert standalone.deps["teacher_logprob"] == {"rollout"}
    colocated = dry("experiment=gkd/rollout_colocate_teacher_colocate").dag
    assert "handover" not in {n.name for n in colocated.nodes}
