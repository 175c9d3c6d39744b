"""`--config FILE.yaml`: ms-swift's Ray YAML as written (or refused key by key), dagrl-keyed files, and
names that do not exist (presets, files, DAGs) as errors before Ray, never the default job."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess

import pytest
from omegaconf import OmegaConf

from dagrl.config.placement import format_plan
from dagrl.errors import ConfigError, DagError
from dagrl.main import compose, main, parse_args
from dagrl.trainer.setup import prepare
from tests.config.test_config import REPO
from tests.conftest import main_in_process

SWIFT = REPO / "examples" / "ms_swift"
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def typed(*argv: str):
    _, overrides = parse_args(list(argv))
    return OmegaConf.to_object(compose(overrides))


def planned(*argv: str):
    cfg = typed(*argv, "trainer.dry_run=true")
    return cfg, prepare(cfg)


def comparable(cfg) -> dict:
    """The typed config without the keys whose form differs but not their plan (the plan and the
    role specs are compared as well): per-role gpus the file states vs an even split of the
    declared cluster, and the teacher dtype stated vs inherited from the model's."""
    tree = dataclasses.asdict(cfg)
    tree["placement"].pop("gpus")
    tree["teacher"].pop("dtype")
    tree["teacher"].pop("gpus")
    return tree


@pytest.mark.parametrize(
    "name",
    [
        "rollout_colocate_teacher_colocate",
        "rollout_separate_teacher_colocate",
        "rollout_colocate_teacher_standalone",
    ],
)
def test_shipped_ms_swift_gkd_yaml_plans_like_its_preset(name):
    swift_cfg, swift = planned("--config", str(SWIFT / f"{name}.yaml"))
    preset_cfg, preset = planned(f"experiment=gkd/{name}")
    assert format_plan(swift.plan) == format_plan(preset.plan)
    assert swift.plan.specs == preset.plan.specs
    assert comparable(swift_cfg) == comparable(preset_cfg)


def test_shipped_ms_swift_grpo_yaml_plans_like_the_dagrl_command_line():
    swift_cfg, swift = planned("--config", str(SWIFT / "grpo_separate.yaml"))
    dagrl_cfg, dagrl = planned(
        "placement=separate",
        "trainer.device=cuda",
        "trainer.n_gpus_per_node=8",
        "placement.gpus.train=4",
        "placement.gpus.rollout=4",
        f"{R}.name=vllm",
        f"{R}.n=8",
        f"{R}.gpu_memory_utilization=0.8",
        f"{R}.free_cache_engine=false",
        f"{A}.ppo_mini_batch_size=8",
        "data.train_batch_size=16",
        "actor_rollout_ref.model.dtype=bfloat16",
        "reward.functions=[{name: arith, weight: 1.0}]",
        "trainer.seed=42",
        f"{A}.optim.lr=1e-6",
        f"{A}.clip_ratio=0.2",
        f"{A}.clip_ratio_high=0.28",
        f"{A}.kl_loss_coef=0",
    )
    assert format_plan(swift.plan) == format_plan(dagrl.plan)
    assert swift.plan.specs == dagrl.plan.specs
    assert dataclasses.asdict(swift_cfg) == dataclasses.asdict(dagrl_cfg)


@pytest.mark.parametrize(
    "name,groups",
    [
        ("rollout_separate_teacher_colocate", [(["train", "teacher"], 4), (["rollout"], 4)]),
        ("rollout_colocate_teacher_standalone", [(["train", "rollout"], 4), (["teacher"], 4)]),
    ],
)
def test_gkd_presets_split_the_declared_cluster(name, groups):
    """No 1 + 1 pinned: on a declared 8-GPU node the two groups get 4 each, none idle."""
    _, prep = planned(f"experiment=gkd/{name}", "trainer.n_gpus_per_node=8")
    assert [(g.roles, len(g.slots)) for g in prep.plan.groups] == groups
    assert "idle" not in format_plan(prep.plan)


def test_ms_swift_gpus_without_colocate_groups_are_separate(tmp_path):
    """ms-swift: a role in no colocate group owns its GPUs; 4 + 4 on 8, none idle."""
    path = tmp_path / "my.yaml"
    path.write_text("rlhf_type: grpo\nuse_vllm: true\ntrain: {gpus: 4}\nrollout: {gpus: 4}\n")
    cfg, prep = planned("--config", str(path))
    plan = prep.plan
    assert (plan.total_slots, cfg.trainer.n_gpus_per_node) == (8, 8)
    assert [g.roles for g in plan.groups] == [["train"], ["rollout"]]
    assert plan.group_of("rollout").slots == [4, 5, 6, 7]
    path.write_text(path.read_text() + "colocate_groups: [[train, rollout]]\n")
    cfg, prep = planned("--config", str(path))
    assert [g.roles for g in prep.plan.groups] == [["train", "rollout"]] and cfg.trainer.n_gpus_per_node == 4


def test_a_users_edited_yaml_runs_its_own_settings_and_overrides_come_after(tmp_path):
    path = tmp_path / "rollout_colocate_teacher_colocate.yaml"  # a shipped preset's name, edited
    text = (SWIFT / "rollout_colocate_teacher_colocate.yaml").read_text()
    path.write_text(text.replace("lr: 1e-6", "lr: 3e-6").replace("gkd_logits_topk: 64", "gkd_logits_topk: 8"))
    cfg = typed("--config", str(path), "algorithm.gkd.beta=0.2")
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-6 and cfg.algorithm.gkd.gkd_logits_topk == 8
    assert cfg.algorithm.gkd.beta == 0.2  # the command line wins over the file's `beta: 0.5`


def test_run_sh_runs_the_users_file_not_the_preset_of_that_name(tmp_path, capsys):
    from tests.launch_scripts import dagrl_argv

    path = tmp_path / "rollout_colocate_teacher_colocate.yaml"
    text = (SWIFT / "rollout_separate_teacher_colocate.yaml").read_text()
    path.write_text(text.replace("gpus: 1\n\nrollout:", "gpus: 2\n\nrollout:"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = ["bash", str(REPO / "run_scripts/gkd/run.sh"), str(path), "trainer.dry_run=true"]
    argv = dagrl_argv(cmd, env, tmp_path, REPO)  # the command run.sh runs, planned in process
    assert argv[:2] == ["--config", str(path)], argv
    code, out = main_in_process(capsys, *argv, f"trainer.default_local_dir={tmp_path}")
    assert code == 0, out
    assert "cluster: 1 node(s) × 3 GPU(s), 3 used" in out  # train 2 + rollout 1, separate
    missing = subprocess.run(
        ["bash", "run_scripts/gkd/run.sh", "/path/to/my_edit.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "no such file: /path/to/my_edit.yaml" in missing.stderr


def test_a_dagrl_keyed_file_nested_or_dotted(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "algorithm: gkd\n"
        "trainer:\n  n_gpus_per_node: 2\n"
        "actor_rollout_ref.rollout.n: 2\n"
        "placement: {gpus: {train: 1, rollout: 1}, colocate_groups: [[train, ref], [rollout]]}\n"
        "teacher: {engine_kwargs: {max_logprobs: 8}}\n"
    )
    cfg = typed("--config", str(path), "trainer.n_gpus_per_node=4")
    assert cfg.algorithm.name == "gkd" and cfg.actor_rollout_ref.rollout.n == 2
    assert cfg.trainer.n_gpus_per_node == 4 and cfg.placement.gpus["rollout"] == 1
    assert cfg.teacher.engine_kwargs == {"max_logprobs": 8}


def test_every_key_a_file_cannot_honour_is_named_at_once(tmp_path):
    path = tmp_path / "swift.yaml"
    path.write_text(
        "rlhf_type: gkd\ndataset: x#2000\nmin_lr: 1e-7\ntrain: {gpus: 2, tuner_type: lora, lora_rank: 8, foo: 1}\n"
        "rollout: {gpus: 2}\ndataset_num_proc: 4\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", str(path)])
    text = str(info.value)
    assert text.startswith(f"{path}: 3 setting(s) cannot be honoured")  # LoRA keys are dagrl's
    for key in ("'dataset'", "'min_lr'", "'train.foo'"):
        assert key in text, key
    assert "dataset_num_proc" not in text  # no effect on results: a note, not a refusal


@pytest.mark.parametrize(
    "argv,says",
    [
        (["experiment=/path/to/my_gkd"], "no such preset"),
        (
            ["experiment=gkd/rollout_colocate_teacher_colocat"],
            "did you mean 'experiment=gkd/rollout_colocate_teacher_colocate'",
        ),
        (["algorithm=gdk"], "did you mean 'algorithm=gkd'"),
        (["--config", "/path/to/my_gkd.yaml"], "no such file"),
        (["--config", "/path/to/my_gkd"], "no such file; --config takes the path of a YAML file"),
        (
            ["--config", "gkd/rollout_colocate_teacher_colocate"],
            "experiment=gkd/rollout_colocate_teacher_colocate runs the shipped preset",
        ),
        (["dag=gkdd"], "did you mean 'gkd'"),
    ],
)
def test_a_name_that_does_not_exist_is_an_error_before_ray(argv, says, capsys, monkeypatch):
    import ray

    # an earlier test's session Ray may be up: Ray reads as down and a call to ray.init is what
    # tells, in any order
    def no_ray(*args, **kwargs):
        raise AssertionError("ray.init called before the error")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_ray)
    with pytest.raises(SystemExit) as info:
        main([*argv, "trainer.dry_run=true"])
    out = capsys.readouterr().out
    assert info.value.code == 2 and says in out, out
    assert "dry run" not in out


def test_a_preset_file_given_as_experiment_points_to_config(tmp_path):
    path = tmp_path / "my_gkd.yaml"
    path.write_text("rlhf_type: gkd\n")
    with pytest.raises(ConfigError, match=f"--config {path}"):
        compose([f"experiment={path}"])
    with pytest.raises(ConfigError, match=f"--config {path}"):  # the file's name without .yaml
        compose([f"experiment={tmp_path / 'my_gkd'}"])
    with pytest.raises(ConfigError, match=re.escape(f"--config FILE.yaml (none at {tmp_path / 'mine'})")):
        compose([f"experiment={tmp_path / 'mine'}"])


def test_a_missing_config_file_is_one_line_naming_where_it_was_looked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out = main_in_process(capsys, "--config", "runs/my_gkd", "trainer.dry_run=true")
    assert code == 2 and out.strip() == (
        f"error: config key '--config' = 'runs/my_gkd': no such file at {tmp_path / 'runs' / 'my_gkd'};"
        " --config takes the path of a YAML file of your own (FILE.yaml); a shipped preset is group=name"
        " (python -m dagrl.main --help lists them)"
    ), out


def test_a_preset_holding_ms_swift_keys_names_the_key_and_the_file(tmp_path, monkeypatch):
    import dagrl.main as dm

    conf = tmp_path / "conf"
    shutil.copytree(dm.CONF_DIR, conf)
    (conf / "experiment" / "gkd" / "mine.yaml").write_text("# @package _global_\nnum_generations: 4\n")
    monkeypatch.setattr(dm, "CONF_DIR", str(conf))
    with pytest.raises(ConfigError) as info:
        dm.compose(["experiment=gkd/mine"])
    text = str(info.value)
    assert (
        "num_generations" in text and "actor_rollout_ref.rollout.n" in text and "no such preset" not in text
    )


def test_dag_suggests_the_nearest():
    from dagrl.core.dag import load_dag_specs

    with pytest.raises(DagError, match="did you mean 'opsd'"):
        load_dag_specs("opsdd")


def test_cfg_job_shows_what_the_file_became(capsys):
    main(["--config", str(SWIFT / "rollout_colocate_teacher_standalone.yaml"), "--cfg", "job"])
    out = capsys.readouterr().out
    assert "placement: standalone" in out and "max_logprobs: 64" in out and "lr: 1.0e-06" in out


def swift_file(tmp_path, text: str) -> str:
    path = tmp_path / "swift.yaml"
    path.write_text("rlhf_type: grpo\nnum_generations: 8\nglobal_batch_size: 64\n" + text)
    return str(path)


@pytest.mark.parametrize(
    "save_key,eval_key", [("save_steps", "eval_steps"), ("save_interval", "eval_interval")]
)
def test_ms_swift_step_counts_are_optimizer_steps(tmp_path, save_key, eval_key):
    """ms-swift counts optimizer steps; one dagrl step is one rollout feeding steps_per_generation."""
    text = f"steps_per_generation: 4\ntrain_iters: 400\n{save_key}: 40\n{eval_key}: 20\n"
    t = typed("--config", swift_file(tmp_path, text)).trainer
    assert (t.total_training_steps, t.save_freq, t.test_freq) == (100, 10, 5)
    one = typed("--config", swift_file(tmp_path, f"train_iters: 30\n{save_key}: 6\n{eval_key}: 3\n")).trainer
    assert (one.total_training_steps, one.save_freq, one.test_freq) == (30, 6, 3)


def test_ms_swift_eval_interval_defaults_to_the_save_interval(tmp_path):
    t = typed("--config", swift_file(tmp_path, "steps_per_generation: 2\nsave_steps: 10\n")).trainer
    assert (t.save_freq, t.test_freq) == (5, 5)
    later = typed("--config", swift_file(tmp_path, "save_steps: 10\n"), "trainer.test_freq=3").trainer
    assert (later.save_freq, later.test_freq) == (10, 3)


@pytest.mark.parametrize("key", ["train_iters", "save_steps", "save_interval", "eval_steps", "eval_interval"])
def test_ms_swift_step_count_not_a_multiple_is_one_line(tmp_path, key):
    with pytest.raises(ConfigError) as info:
        typed("--config", swift_file(tmp_path, f"steps_per_generation: 4\n{key}: 42\n"))
    assert (info.value.key, info.value.value) == (key, 42)
    text = str(info.value)
    assert "\n" not in text and "give a multiple of 4 (e.g. 40 or 44)" in text, text


def test_ms_swift_epochs_and_checkpoints_kept(tmp_path):
    t = typed("--config", swift_file(tmp_path, "max_epochs: 3\nsave_total_limit: 4\n")).trainer
    assert (t.total_epochs, t.total_training_steps, t.max_actor_ckpt_to_keep) == (3, None, 4)
    t = typed("--config", swift_file(tmp_path, "num_train_epochs: 2\nsave_total_limit: null\n")).trainer
    assert (t.total_epochs, t.total_training_steps, t.max_actor_ckpt_to_keep) == (2, None, None)
