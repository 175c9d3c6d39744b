"""Config composition, the CLI's handling of bad keys, and every cross-field rule in config/validate.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dagrl.config.placement import make_plan
from dagrl.config.validate import validate_with_plan
from dagrl.data.builtin import tiny_model_path
from dagrl.errors import ConfigError, DagError, PlacementError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config, main_in_process, validated_config

REPO = Path(__file__).resolve().parents[2]
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


def run_cli(*overrides: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`python -m dagrl.main overrides...` from the repo root (dagrl writes no Hydra output folder),
    in a fresh interpreter; the other tests here run the command line in this process
    (tests/conftest.py main_in_process)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-m", "dagrl.main", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def shipped_model_dir() -> str:
    """The tiny model the package ships (built by tools/build_tiny_model.py); its absence is a failure."""
    path = tiny_model_path()
    if not os.path.isfile(os.path.join(path, "config.json")):
        pytest.fail(
            f"the shipped tiny model is missing: no {path}/config.json (run tools/build_tiny_model.py)"
        )
    return path


def write_model_config(directory: Path) -> str:
    """A HF config.json only: enough for planning and the memory estimate, which build on the meta device."""
    from transformers import Qwen2Config

    Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(directory)
    return str(directory)


checked = validated_config


# ---- the command line ----------------------------------------------------------------------------


def test_compose_gives_typed_defaults():
    cfg = compose_config()
    assert cfg.data.train_batch_size == 16
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.placement.colocate_groups == [["train", "rollout", "ref"]]
    cfg = compose_config("placement=separate", "placement.gpus.rollout=3")
    assert cfg.placement.colocate_groups == [["train", "ref"], ["rollout"]]
    assert cfg.placement.gpus["rollout"] == 3


def test_unknown_key_fails_naming_it(capsys):
    with pytest.raises(Exception, match="train_batch_sizee"):
        compose_config("data.train_batch_sizee=4")
    code, out = main_in_process(capsys, "data.train_batch_sizee=4")
    assert code != 0
    assert "data.train_batch_sizee" in out


def test_unknown_role_in_placement_gpus_fails(tmp_path):
    with pytest.raises(Exception, match="placement.gpus.rollot"):
        compose_config("placement.gpus.rollot=2")


def test_wrong_type_fails_naming_key(capsys):
    with pytest.raises(Exception, match="data.train_batch_size"):
        compose_config("data.train_batch_size=abc")
    code, out = main_in_process(capsys, "data.train_batch_size=abc")
    assert code != 0
    assert "data.train_batch_size" in out and "abc" in out


def test_cfg_job_prints_resolved_config(capsys):
    code, out = main_in_process(capsys, "--cfg", "job", "data.train_batch_size=32")
    assert code == 0, out
    assert "train_batch_size: 32" in out
    # interpolations are shown after resolution only with --resolve; the key itself must be there
    assert "default_local_dir:" in out


def test_dagrl_error_exits_2_with_key(tmp_path):
    proc = run_cli(f"{R}.n=1", tmp_path=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert f"error: config key '{R}.n'" in out
    assert "Traceback" not in out


def test_algorithm_presets_from_the_command_line(capsys):
    code, out = main_in_process(capsys, "--cfg", "job", "algorithm=gspo")
    assert code == 0, out
    assert "name: gspo" in out and "clip_ratio_high: 0.0004" in out
    # an algorithm rule fails like every config rule: exit 2, the key, no traceback
    code, out = main_in_process(
        capsys, "algorithm=dr_grpo", f"{A}.loss_agg_mode=token-mean", "trainer.dry_run=true"
    )
    assert code == 2, out
    assert f"error: config key '{A}.loss_agg_mode'" in out and "Traceback" not in out


def test_dry_run_plans_cluster_without_gpus(capsys):
    shipped_model_dir()
    code, out = main_in_process(
        capsys,
        "trainer.dry_run=true",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=4",
        "trainer.device=cuda",
        "placement=separate",
    )
    assert code == 0, out
    assert "cluster: 2 node(s) × 4 GPU(s), 8 used" in out
    # without KL there is no ref role: train takes node 0 and rollout node 1, 4 GPUs each
    assert "group 0 (separate): roles ['train'] on node 0: GPUs [0, 1, 2, 3]" in out
    assert "group 1 (separate): roles ['rollout'] on node 1: GPUs [0, 1, 2, 3]" in out
    assert "rollout: 4 workers, DP=4" in out
    assert "dry run: plan printed, no workers started" in out


def test_dry_run_with_ref_and_uneven_split(tmp_path, capsys):
    model = write_model_config(tmp_path / "model")
    code, out = main_in_process(
        capsys,
        "trainer.dry_run=true",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=4",
        "trainer.device=cuda",
        "placement=separate",
        "placement.gpus.train=6",
        "placement.gpus.ref=6",
        "placement.gpus.rollout=2",
        f"actor_rollout_ref.model.path={model}",
        f"{A}.optim.lr=1e-6",
        f"{A}.use_kl_loss=true",
        "data.train_batch_size=12",  # 12 × 8 = 96 responses split over DP 6 and DP 2
        f"{A}.ppo_mini_batch_size=12",
    )
    assert code == 0, out
    assert (
        "group 0 (colocated): roles ['train', 'ref'] on node 0: GPUs [0, 1, 2, 3], node 1: GPUs [0, 1]" in out
    )
    assert "group 1 (separate): roles ['rollout'] on node 1: GPUs [2, 3]" in out
    assert "train: 6 workers, DP=6" in out and "ref: 6 workers, DP=6" in out


# ---- cross-field rules ---------------------------------------------------------------------------


def expect_config_error(key: str, fix: str, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        checked(*overrides)
    assert info.value.key == key
    assert key in str(info.value)
    assert fix in str(info.value)
    return info.value


def test_defaults_pass_and_get_builtin_lr():
    cfg = checked()
    assert cfg.actor_rollout_ref.actor.optim.lr > 0


def test_mini_batch_must_divide_train_batch():
    exc = expect_config_error(
        f"{A}.ppo_mini_batch_size", "must divide data.train_batch_size=16", f"{A}.ppo_mini_batch_size=5"
    )
    assert exc.value == 5


def test_rollout_n_of_one_rejected():
    # GRPO's group rule belongs to the advantage node: it runs when the DAG has one (prepare)
    from dagrl.trainer.setup import prepare

    with pytest.raises(ConfigError) as info:
        prepare(compose_config(f"{R}.n=1", "trainer.dry_run=true"))
    assert info.value.key == f"{R}.n" and "use rollout.n >= 2" in str(info.value)


def test_model_path_needs_lr(tmp_path):
    model_dir = tiny_model_path()
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        model_dir = str(tmp_path)
        (tmp_path / "config.json").write_text("{}")
    expect_config_error(f"{A}.optim.lr", "set the learning rate", f"actor_rollout_ref.model.path={model_dir}")
    # with the rate given, the same model path passes
    cfg = checked(f"actor_rollout_ref.model.path={model_dir}", f"{A}.optim.lr=1e-6")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6


def test_missing_train_file(tmp_path):
    missing = tmp_path / "nope.parquet"
    exc = expect_config_error("data.train_files", "no such file", f"data.train_files={missing}")
    assert exc.value == str(missing)


def composition_error(*overrides: str) -> str:
    """The text of the error composing these overrides raises (Hydra's, with OmegaConf's cause)."""
    with pytest.raises(Exception) as info:
        compose_config(*overrides)
    return f"{info.value} {info.value.__cause__}"


def test_bad_loss_agg_mode():
    # a closed set, checked at the command line: the error names the key and the accepted values
    text = composition_error(f"{A}.loss_agg_mode=token-sum")
    assert f"{A}.loss_agg_mode" in text and "seq_mean_token_sum_norm" in text
    # verl's spelling and the member name both pass
    assert checked(f"{A}.loss_agg_mode=seq-mean-token-mean").actor_rollout_ref.actor.loss_agg_mode.value == (
        "seq-mean-token-mean"
    )
    checked(f"{A}.loss_agg_mode=seq_mean_token_mean")


def test_bad_kl_loss_type():
    text = composition_error(f"{A}.kl_loss_type=k9")
    assert f"{A}.kl_loss_type" in text and "low_var_kl" in text
    checked(f"{A}.kl_loss_type=k3")  # canonical names and verl aliases both pass
    assert checked("algorithm.kl_penalty=low_var_kl").algorithm.kl_penalty.value == "k3"


def test_cpu_affinity_is_one_of_its_choices_refused_at_the_command_line(capsys):
    from dagrl.config.enums import CpuAffinity

    assert compose_config().trainer.cpu_affinity == CpuAffinity.none  # until the GPU hosts' measurement
    assert checked("trainer.cpu_affinity=gpu_local").trainer.cpu_affinity == CpuAffinity.gpu_local
    code, out = main_in_process(capsys, "trainer.cpu_affinity=gpu", "trainer.dry_run=true")
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code != 0 and errors == [
        "error: config key 'trainer.cpu_affinity' = 'gpu': did you mean 'gpu_local'? options: none, gpu_local"
    ], out
    assert "placed" not in out  # refused before any worker


def test_hf_rollout_rejects_tensor_parallel():
    expect_config_error(
        f"{R}.tensor_model_parallel_size", "rollout.name=vllm", f"{R}.tensor_model_parallel_size=2"
    )
    checked(f"{R}.name=vllm", f"{R}.tensor_model_parallel_size=2")  # vllm takes a TP size


def test_rows_must_split_over_dp():
    # 16 prompts × 8 responses = 128 rows over 3 DP ranks; prepare fails before touching a model or Ray
    cfg = compose_config("trainer.n_gpus_per_node=3")
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    assert info.value.key == "data.train_batch_size"
    assert "3 DP ranks" in str(info.value) and "pick a batch size" in str(info.value)


def test_mini_batch_must_split_over_dp():
    # 12 prompts × 2 = 24 rows split over 8 ranks (3 each), but a mini-batch of 6×2 = 12 does not
    cfg = checked(
        "trainer.n_gpus_per_node=8", "data.train_batch_size=12", f"{A}.ppo_mini_batch_size=6", f"{R}.n=2"
    )
    plan = make_plan(cfg, {"train", "rollout"}, "cpu")
    with pytest.raises(ConfigError) as info:
        validate_with_plan(cfg, plan)
    assert info.value.key == f"{A}.ppo_mini_batch_size"
    assert "DP = 8" in str(info.value)


def test_colocated_roles_must_ask_same_devices():
    cfg = checked("trainer.n_gpus_per_node=2", "placement.gpus.train=2", "placement.gpus.rollout=1")
    with pytest.raises(PlacementError, match="ask for different device counts") as info:
        make_plan(cfg, {"train", "rollout"}, "cpu")
    assert "placement.gpus" in str(info.value)


def test_roles_over_cluster_size():
    cfg = checked(
        "placement=separate",
        "trainer.n_gpus_per_node=2",
        "placement.gpus.train=2",
        "placement.gpus.rollout=1",
    )
    with pytest.raises(PlacementError) as info:
        make_plan(cfg, {"train", "rollout"}, "cpu")
    msg = str(info.value)
    assert "3 devices" in msg and "= 2" in msg and "lower placement.gpus or grow the cluster" in msg


def test_unknown_dag_name():
    cfg = compose_config("dag=no_such_dag")
    with pytest.raises(DagError, match="no_such_dag") as info:
        prepare(cfg)
    assert "grpo" in str(info.value)  # lists the DAGs that exist
