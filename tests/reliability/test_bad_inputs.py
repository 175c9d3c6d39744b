"""A corpus of malformed and contradictory command lines and bad data files: each is stopped before
any worker starts, with one line naming the key, file or row.

Most cases run `dagrl.main.run` in this process with `launch` (Ray, workers) replaced by a failure,
so a case that got as far as starting workers fails the test; a few run the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagrl.errors import DagrlError
from tests.conftest import compose_config, main_in_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
TINY = os.path.join(REPO, "dagrl", "assets", "tiny_arith")
TEACHER = os.path.join(REPO, "dagrl", "assets", "tiny_arith_teacher")

# (overrides, what the message must name); {tmp} is the test's own directory (see `fill`)
CONFIGS = [
    # every numeric setting's declared range
    (["trainer.total_epochs=0"], "trainer.total_epochs"),
    (["trainer.total_epochs=-1"], "trainer.total_epochs"),
    (["trainer.save_freq=-2"], "trainer.save_freq"),
    (["trainer.save_freq=0"], "trainer.save_freq"),
    (["trainer.test_freq=-5"], "trainer.test_freq"),
    (["trainer.test_freq=0"], "trainer.test_freq"),
    ([f"{A}.grad_clip=-1"], f"{A}.grad_clip"),
    ([f"{A}.grad_clip=0"], f"{A}.grad_clip"),
    ([f"{A}.optim.betas=[0.9,1.5]"], f"{A}.optim.betas[1]"),
    ([f"{A}.optim.betas=[-0.1,0.999]"], f"{A}.optim.betas[0]"),
    ([f"{A}.optim.betas=[0.9]"], f"{A}.optim.betas"),
    ([f"{A}.optim.eps=0"], f"{A}.optim.eps"),
    ([f"{A}.optim.eps=-1e-8"], f"{A}.optim.eps"),
    ([f"{A}.optim.weight_decay=-0.01"], f"{A}.optim.weight_decay"),
    ([f"{A}.optim.lr=-1e-5"], f"{A}.optim.lr"),
    ([f"{A}.optim.lr=0"], f"{A}.optim.lr"),
    ([f"{A}.optim.lr_warmup_steps=-1"], f"{A}.optim.lr_warmup_steps"),
    ([f"{A}.ppo_micro_batch_size_per_gpu=0"], f"{A}.ppo_micro_batch_size_per_gpu"),
    ([f"{A}.ppo_mini_batch_size=0"], f"{A}.ppo_mini_batch_size"),
    ([f"{A}.ppo_epochs=0"], f"{A}.ppo_epochs"),
    ([f"{R}.log_prob_micro_batch_size_per_gpu=0"], f"{R}.log_prob_micro_batch_size_per_gpu"),
    (["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0"], "ref.log_prob_micro_batch_size_per_gpu"),
    ([f"{R}.micro_batch_size_per_gpu=0"], f"{R}.micro_batch_size_per_gpu"),
    (["data.seed=-1"], "data.seed"),
    (["data.train_batch_size=0"], "data.train_batch_size"),
    (["data.max_prompt_length=0"], "data.max_prompt_length"),
    (["data.max_response_length=-3"], "data.max_response_length"),
    (["data.val_batch_size=0"], "data.val_batch_size"),
    ([f"{R}.val_kwargs.temperature=-1"], f"{R}.val_kwargs.temperature"),
    ([f"{R}.val_kwargs.top_p=2"], f"{R}.val_kwargs.top_p"),
    ([f"{R}.val_kwargs.top_p=0"], f"{R}.val_kwargs.top_p"),
    ([f"{R}.val_kwargs.n=0"], f"{R}.val_kwargs.n"),
    ([f"{R}.val_kwargs.top_k=0"], f"{R}.val_kwargs.top_k"),
    ([f"{R}.temperature=-0.5"], f"{R}.temperature"),
    ([f"{R}.top_p=1.5"], f"{R}.top_p"),
    ([f"{R}.n=0"], f"{R}.n"),
    ([f"{R}.top_k=-2"], f"{R}.top_k"),
    ([f"{R}.gpu_memory_utilization=1.2"], f"{R}.gpu_memory_utilization"),
    ([f"{R}.sleep_level=3"], f"{R}.sleep_level"),
    ([f"{R}.overlap_steps=2"], f"{R}.overlap_steps"),
    ([f"{R}.weight_sync_bucket_mb=0"], f"{R}.weight_sync_bucket_mb"),
    ([f"{A}.clip_ratio=0"], f"{A}.clip_ratio"),
    ([f"{A}.clip_ratio_high=12"], f"{A}.clip_ratio_high"),
    ([f"{A}.clip_ratio_c=0.5"], f"{A}.clip_ratio_c"),
    ([f"{A}.kl_loss_coef=-1"], f"{A}.kl_loss_coef"),
    ([f"{A}.kl_loss_coef=nan"], f"{A}.kl_loss_coef"),
    ([f"{A}.entropy_coeff=inf"], f"{A}.entropy_coeff"),
    (["algorithm.kl_ctrl.kl_coef=-0.1"], "algorithm.kl_ctrl.kl_coef"),
    (["algorithm.rollout_correction.rollout_is_threshold=0"], "rollout_is_threshold"),
    (["algorithm.gkd.beta=1.5"], "algorithm.gkd.beta"),
    (["trainer.nnodes=0"], "trainer.nnodes"),
    (["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node"),
    (["trainer.seed=-1"], "trainer.seed"),
    (["trainer.max_actor_ckpt_to_keep=0"], "trainer.max_actor_ckpt_to_keep"),
    (["trainer.total_training_steps=0"], "trainer.total_training_steps"),
    (["trainer.max_consecutive_skipped_steps=-1"], "trainer.max_consecutive_skipped_steps"),
    (["teacher.log_prob_micro_batch_size_per_gpu=0"], "teacher.log_prob_micro_batch_size_per_gpu"),
    (["placement.gpus.rollout=-1"], "placement.gpus.rollout"),
    ([f"{A}.megatron.tensor_model_parallel_size=0"], f"{A}.megatron.tensor_model_parallel_size"),
    (["reward.functions=[{name: arith, weight: nan}]"], "reward.functions[0].weight"),
    # settings that contradict each other
    (["data.train_batch_size=6"], f"{A}.ppo_mini_batch_size"),
    ([f"{R}.tensor_model_parallel_size=2"], f"{R}.tensor_model_parallel_size"),
    ([f"{A}.recompute_old_logprobs=false", f"{A}.ppo_epochs=2"], f"{A}.recompute_old_logprobs"),
    (
        ["algorithm.rollout_correction.rollout_is=token", f"{R}.calculate_log_probs=false"],
        "calculate_log_probs",
    ),
    (["algorithm.rollout_correction.rollout_rs_threshold_lower=3"], "rollout_rs_threshold"),
    ([f"{R}.overlap_steps=1"], f"{R}.overlap_steps"),
    ([f"teacher.model={TEACHER}", "teacher.gpus=2"], "teacher.gpus"),
    ([f"teacher.model={TEACHER}", "teacher.placement=standalone"], "teacher.placement"),  # vLLM: GPUs
    (["trainer.device=cuda"], "trainer.device"),
    ([f"{R}.name=vllm", "trainer.device=cpu"], f"{R}.name"),
    (["reward.functions=[{name: no_such_reward}]"], "reward.functions"),
    (["reward.functions=[{name: arith},{name: arith}]"], "reward.functions[1].name"),
    ([f"actor_rollout_ref.model.path={TINY}"], f"{A}.optim.lr"),
    # files and directories named by the config
    (["data.train_files={tmp}/missing.parquet"], "data.train_files"),
    ([f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/no_model"], "actor_rollout_ref.model.path"),
    ([f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/model_no_weights"], "no weights"),
    (
        [f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/model_bad_config"],
        "config.json is not valid JSON",
    ),
    ([f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/model_no_type"], "model_type"),
    (
        [f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/model_truncated"],
        "model.safetensors is damaged",
    ),
    ([f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/model_missing_shard"], "missing"),
    (["teacher.model={tmp}/model_no_weights"], "teacher.model"),
    (["trainer.resume_mode={tmp}/empty_dir"], "trainer.resume_mode"),
    (["trainer.resume_mode={tmp}/no_such_checkpoint"], "trainer.resume_mode"),
    (["trainer.default_local_dir=''"], "trainer.default_local_dir"),
    (["trainer.default_local_dir={tmp}/a_file"], "trainer.default_local_dir"),
    (["trainer.default_local_dir={tmp}/a_file/sub"], "trainer.default_local_dir"),
    (["dag={tmp}/yaml_error.yaml"], "not valid YAML at line"),
    (["dag={tmp}/list.yaml"], "a DAG file is a mapping"),
    (["dag={tmp}/no_kind.yaml"], "needs 'kind'"),
    (["dag={tmp}/inputs_string.yaml"], "'inputs' must be a list"),
    (["dag={tmp}/unknown_kind.yaml"], "teleport"),
    (["dag=no_such_dag"], "dag='no_such_dag'"),
    (["trainer.ray_address=no-port-here"], "trainer.ray_address"),
    (["trainer.ray_address=127.0.0.1:1"], "trainer.ray_address"),
    # wrong types and names: Hydra refuses them while composing, naming the key
    (["trainer.total_epochs=abc"], "total_epochs"),
    ([f"{A}.strategy=tensorflow"], "strategy"),
    (["trainer.logger=[slack]"], "logger"),
    (["actor_rollout_ref.model.dtype=int8"], "dtype"),
    (["algorithm=no_such_algorithm"], "algorithm"),
]

ROW = {
    "data_source": "dagrl/arith",
    "prompt": [{"role": "user", "content": "What is 2+3?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "5"},
    "extra_info": {"split": "train", "index": 0},
}


def _rows(n: int = 8, **change) -> list[dict]:
    rows = [dict(ROW, extra_info={"split": "train", "index": i}) for i in range(n)]
    for index, fields in change.items():
        rows[int(index.lstrip("r"))].update(fields)
    return rows


def _without(column: str) -> list[dict]:
    return [{k: v for k, v in row.items() if k != column} for row in _rows()]


# (file name, rows or raw bytes, extra overrides, what the message must name)
DATA = [
    ("not_parquet.parquet", b"data_source,prompt\nx,y\n", [], "not a readable parquet file"),
    ("empty.parquet", b"", [], "not a readable parquet file"),
    ("no_data_source.parquet", _without("data_source"), [], "missing column(s) ['data_source']"),
    ("no_prompt.parquet", _without("prompt"), [], "data.prompt_key' = 'prompt'"),
    ("prompt_string.parquet", [dict(r, prompt="What is 2+3?") for r in _rows()], [], "row 0"),
    ("bad_role.parquet", _rows(r2={"prompt": [{"role": "bot", "content": "hi"}]}), [], "row 2"),
    ("empty_prompt.parquet", _rows(r5={"prompt": []}), [], "row 5"),
    ("no_truth.parquet", _rows(r1={"reward_model": {"style": "rule", "ground_truth": ""}}), [], "row 1"),
    ("unknown_source.parquet", _rows(r6={"data_source": "mystery/set"}), [], "row 6: no default reward"),
    ("null_data_source.parquet", _rows(r4={"data_source": None}), [], "row 4"),
    (
        "too_few_rows.parquet",
        _rows(3),
        ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
        "larger than the 3 rows",
    ),
    (
        "overlong.parquet",
        _rows(r0={"prompt": [{"role": "user", "content": "9 " * 200}]}),
        ["data.filter_overlong_prompts=false"],
        "row 0: prompt is",
    ),
    ("a_directory.parquet", None, [], "data.train_files"),
]


def _write(path: str, content) -> None:
    if content is None:
        os.makedirs(path)
    elif isinstance(content, bytes):
        with open(path, "wb") as f:
            f.write(content)
    else:  # rows whose columns may differ in type from row to row: one type per column for Arrow
        columns = {k: [row.get(k) for row in content] for k in content[0]}
        table = pa.table(
            {k: pa.array([json.dumps(v) for v in vs]) if _mixed(vs) else vs for k, vs in columns.items()}
        )
        pq.write_table(table, path)


def _mixed(values) -> bool:
    return len({type(v) for v in values if v is not None}) > 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The directories and files the corpus names, made once."""
    tmp = tmp_path_factory.mktemp("corpus")
    (tmp / "empty_dir").mkdir()
    (tmp / "a_file").write_text("not a directory")
    models = {
        "model_no_weights": ["config.json", "tokenizer.json", "tokenizer_config.json"],
        "model_bad_config": None,
        "model_no_type": None,
        "model_truncated": None,
        "model_missing_shard": None,
    }
    for name, files in models.items():
        shutil.copytree(
            TINY,
            tmp / name,
            ignore=(lambda d, fs, keep=files: [f for f in fs if f not in keep]) if files else None,
        )
    (tmp / "model_bad_config" / "config.json").write_text('{"model_type": "qwen2",')
    (tmp / "model_no_type" / "config.json").write_text("{}")
    weights = tmp / "model_truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (tmp / "model_missing_shard" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    (tmp / "yaml_error.yaml").write_text("nodes:\n  rollout: {kind: rollout\n  reward: [\n")
    (tmp / "list.yaml").write_text("- rollout\n- reward\n")
    (tmp / "no_kind.yaml").write_text("source: [prompts]\nnodes:\n  rollout: {role: rollout}\n")
    (tmp / "inputs_string.yaml").write_text(
        "source: [prompts]\nnodes:\n  a: {kind: reward, inputs: prompts}\n"
    )
    (tmp / "unknown_kind.yaml").write_text("source: [prompts]\nnodes:\n  a: {kind: teleport}\n")
    for name, content, _, _ in DATA:
        _write(str(tmp / name), content)
    return tmp


def fill(overrides: list[str], tmp) -> list[str]:
    return [o.replace("{tmp}", str(tmp)) for o in overrides]


def stop_before_workers(overrides: list[str], monkeypatch, out_dir) -> tuple[BaseException, float]:
    """What `python -m dagrl.main <overrides>` stops with, and after how many seconds (composing the
    config included); starting workers fails the test."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    import dagrl.trainer.setup as setup
    from dagrl.main import run

    def no_workers(*args, **kwargs):
        raise AssertionError(f"workers were started for {overrides}")

    monkeypatch.setattr(setup, "launch", no_workers)
    start = time.perf_counter()
    with pytest.raises((DagrlError, HydraException, OmegaConfBaseException)) as err:
        run(compose_config(f"trainer.default_local_dir={out_dir}", *overrides))
    return err.value, time.perf_counter() - start


@pytest.mark.parametrize("overrides, named", CONFIGS, ids=[" ".join(c[0])[:80] for c in CONFIGS])
def test_bad_command_line_stops_before_workers(overrides, named, corpus, monkeypatch, tmp_path):
    error, seconds = stop_before_workers(fill(overrides, corpus), monkeypatch, tmp_path / "out")
    message = str(error)
    assert named in message, message
    if isinstance(error, DagrlError):  # dagrl's own: one line with the key/file and the fix
        assert "\n" not in message, message
    assert seconds < 15, seconds


MINI4 = "actor_rollout_ref.actor.ppo_mini_batch_size=4"


@pytest.mark.parametrize("name, content, extra, named", DATA, ids=[d[0] for d in DATA])
def test_bad_data_file_stops_before_workers(name, content, extra, named, corpus, monkeypatch, tmp_path):
    path = str(corpus / name)
    # a batch the 8-row files hold, so that each file's own fault is what stops the run
    error, _ = stop_before_workers(
        [f"data.train_files={path}", f"data.val_files={path}", "data.train_batch_size=4", MINI4, *extra],
        monkeypatch,
        tmp_path / "out",
    )
    message = str(error)
    assert named in message and isinstance(error, DagrlError), message
    assert any(k in message for k in (path, "data.train_files", "data.train_batch_size")), message


def test_corpus_size():
    assert len(CONFIGS) >= 60 and len(DATA) >= 10


@pytest.mark.parametrize(
    "override, named",
    [
        ("trainer.total_epochs=0", "error: config key 'trainer.total_epochs' = 0: must be >= 1"),
        (
            "actor_rollout_ref.actor.grad_clip=-1",
            "error: config key 'actor_rollout_ref.actor.grad_clip' = -1",
        ),
        ("actor_rollout_ref.rollout.val_kwargs.top_p=2", "val_kwargs.top_p' = 2.0: must be in (0, 1]"),
    ],
)
def test_cli_prints_one_line_and_exits_2(override, named, tmp_path, capsys):
    """The command line in this process (tests/config/test_config.py runs one in a fresh interpreter)."""
    code, out = main_in_process(capsys, override, f"trainer.default_local_dir={tmp_path}")
    assert code == 2, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and named in lines[-1], out
    assert "Traceback" not in out and "workers ready" not in out


def test_cli_sigterm_during_the_ray_address_probe_exits_at_once(tmp_path):
    """An address whose TCP connect hangs (a listener that never accepts, its backlog full)."""
    import signal

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(8):  # fill the accept queue so that further connects hang in SYN_SENT
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(server.getsockname())
        fillers.append(s)
    port = server.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagrl.main",
            f"trainer.ray_address=127.0.0.1:{port}",
            f"trainer.default_local_dir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    time.sleep(4)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert time.perf_counter() - sent < 5, out
    assert proc.returncode != 0 and "workers ready" not in out
    server.close()


# ---- round 3: values Hydra cannot read, typos inside list and dict values, logger and Ray-address
# prerequisites. Composed as the CLI composes (dagrl.main.compose, not Hydra's bare compose), with
# the environment of each case; every message is one dagrl line holding all the listed parts.
# (overrides, environment (None = unset), imports blocked, parts of the message); {tmp} = corpus dir
NO_WANDB_CREDENTIALS = {
    "HOME": "{tmp}/home",
    "NETRC": None,
    "WANDB_API_KEY": None,
    "WANDB_MODE": None,
    "WANDB_IDENTITY_TOKEN_FILE": None,
    "WANDB_BASE_URL": None,
}
SMALL = ["data.train_batch_size=4", MINI4]
ROUND3 = [
    # values Hydra's grammar cannot read: say how to quote
    (
        ["trainer.default_local_dir=runs/lr=1e-6"],
        {},
        [],
        [
            "trainer.default_local_dir",
            "'runs/lr=1e-6'",
            "quote it: 'trainer.default_local_dir=\"runs/lr=1e-6\"'",
        ],
    ),
    (["trainer.experiment_name=lr=1e-6"], {}, [], ["trainer.experiment_name", "quote it"]),
    (["data.train_files=data/a=b.parquet"], {}, [], ["data.train_files", "'data/a=b.parquet'", "quote it"]),
    (
        ["trainer.default_local_dir={tmp}/a,b"],
        {},
        [],
        ["trainer.default_local_dir", "sweep", "quote the value"],
    ),
    (["trainer.project_name=team]x"], {}, [], ["trainer.project_name", "'team]x'", "quote it"]),
    (["trainer.default_local_dir={tmp}/it's"], {}, [], ["trainer.default_local_dir", "quote it"]),
    (["trainer.total_epochs=[1"], {}, [], ["trainer.total_epochs", "'[1'", "it takes int"]),
    # quoted, or a plain path: read as written, then checked like any value
    (
        [f"{A}.optim.lr=1e-5", "actor_rollout_ref.model.path={tmp}/no_model=x"],
        {},
        [],
        ["actor_rollout_ref.model.path", "no_model=x"],
    ),
    (
        ['data.train_files="{tmp}/missing=1,2.parquet"'],
        {},
        [],
        ["data.train_files", "missing=1,2.parquet", "no such file"],
    ),
    # typos inside list and dict values: the full key path, the value, the nearest valid choice
    (
        ["placement.colocate_groups=[[trian,rollout]]"],
        {},
        [],
        [
            "placement.colocate_groups[0][0]",
            "'trian'",
            "did you mean 'train'",
            "roles: critic, orm, prm, ref, reward, rm, rollout, sampler, teacher, train",
        ],
    ),
    (
        [
            "placement=separate",
            "trainer.n_gpus_per_node=2",
            "placement.colocate_groups=[[train,ref],[rolout]]",
        ],
        {},
        [],
        ["placement.colocate_groups[1][0]", "'rolout'", "did you mean 'rollout'"],
    ),
    (
        ["placement.colocate_groups=[[train,rollout,reff]]"],
        {},
        [],
        ["placement.colocate_groups[0][2]", "did you mean 'ref'"],
    ),
    (
        ["reward.functions=[{name: arith, weight: abc}]"],
        {},
        [],
        ["reward.functions[0].weight", "'abc'", "must be a number"],
    ),
    (
        ["reward.functions=[{name: arith}, {name: boxed_format, weight: heavy}]"],
        {},
        [],
        ["reward.functions[1].weight", "'heavy'", "must be a number"],
    ),
    (
        ["reward.functions=[{name: arith, wieght: 1}]"],
        {},
        [],
        ["reward.functions[0].wieght", "did you mean 'weight'"],
    ),
    (
        ["reward.functions=[{name: arith}, {name: arth}]"],
        {},
        [],
        ["reward.functions[1].name", "'arth'", "did you mean 'arith'"],
    ),
    (
        ["placement=separate", "trainer.n_gpus_per_node=2", "placement.gpus.rollout=0"],
        {},
        [],
        ["placement.gpus.rollout' = 0", "at least one device"],
    ),
    (
        ["placement=separate", "trainer.n_gpus_per_node=2", "placement.gpus.train=2"],
        {},
        [],
        ["placement.gpus.rollout", "no device is left", "['rollout']"],
    ),
    (["placement.gpus.rollout=two"], {}, [], ["placement.gpus.rollout", "'two'", "whole number"]),
    (
        ["trainer.logger=[console,tensorbord]"],
        {},
        [],
        ["trainer.logger[1]", "'tensorbord'", "did you mean 'tensorboard'"],
    ),
    ([f"{A}.strategy=megatorn"], {}, [], [f"{A}.strategy", "'megatorn'", "did you mean 'megatron'"]),
    (["algorithm=gkdd"], {}, [], ["'algorithm' = 'gkdd'", "did you mean 'algorithm=gkd'"]),
    (
        ["data.train_files={tmp}/good.parquet", "data.val_files={tmp}/no_rows.parquet", *SMALL],
        {},
        [],
        ["data.val_files", "{tmp}/no_rows.parquet", "has no rows"],
    ),
    (
        ["data.train_files={tmp}/no_rows.parquet", "data.val_files={tmp}/good.parquet", *SMALL],
        {},
        [],
        ["data.train_files", "{tmp}/no_rows.parquet"],
    ),
    # loggers that cannot start: refused before Ray
    (
        ["trainer.logger=[console,wandb]"],
        NO_WANDB_CREDENTIALS,
        [],
        ["'trainer.logger' = 'wandb'", "WANDB_API_KEY", "wandb login", "WANDB_MODE=offline"],
    ),
    (
        ["trainer.logger=[console,wandb]"],
        {**NO_WANDB_CREDENTIALS, "NETRC": "{tmp}/netrc_github"},
        [],
        ["no entry for api.wandb.ai in {tmp}/netrc_github"],
    ),
    (
        ["trainer.logger=[wandb]"],
        {**NO_WANDB_CREDENTIALS, "NETRC": "{tmp}/netrc_wandb", "WANDB_BASE_URL": "https://wandb.example.com"},
        [],
        ["no entry for wandb.example.com"],
    ),
    (
        ["trainer.logger=[console,tensorboard]"],
        {},
        ["tensorboard"],
        ["'trainer.logger' = 'tensorboard'", "pip install tensorboard", "'trainer.logger=[console]'"],
    ),
    (["trainer.logger=[wandb]"], {}, ["wandb"], ["'trainer.logger' = 'wandb'", "pip install wandb"]),
    # trainer.ray_address=auto joins a running cluster or stops
    (
        ["trainer.ray_address=auto"],
        {"RAY_ADDRESS": None, "RAY_TMPDIR": "{tmp}/ray_none"},
        [],
        [
            "'trainer.ray_address' = 'auto'",
            "there is none",
            "{tmp}/ray_none/ray/ray_current_cluster",
            "ray start --head",
        ],
    ),
    (
        ["trainer.ray_address=auto"],
        {"RAY_ADDRESS": "127.0.0.1:1"},
        [],
        ["'trainer.ray_address' = 'auto'", "auto found '127.0.0.1:1' in RAY_ADDRESS", "nothing answers"],
    ),
    (
        ["trainer.ray_address=auto"],
        {"RAY_ADDRESS": None, "RAY_TMPDIR": "{tmp}/ray_stale"},
        [],
        ["auto found '127.0.0.1:1' in {tmp}/ray_stale/ray/ray_current_cluster", "nothing answers"],
    ),
    (["trainer.ray_address=auto"], {"RAY_ADDRESS": "just-a-host"}, [], ["'auto'", "use host:port"]),
]


@pytest.fixture(scope="module")
def corpus3(corpus):
    """The round-3 files, next to the corpus's."""
    _write(str(corpus / "good.parquet"), _rows())
    pq.write_table(pq.read_table(corpus / "good.parquet").slice(0, 0), corpus / "no_rows.parquet")
    (corpus / "home").mkdir()
    (corpus / "netrc_github").write_text("machine github.com login x password y\n")
    (corpus / "netrc_wandb").write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    (corpus / "ray_stale" / "ray").mkdir(parents=True)  # RAY_TMPDIR/ray/: where `ray start` records it
    (corpus / "ray_stale" / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")
    return corpus


def stop_as_the_cli_does(overrides, monkeypatch, out_dir) -> tuple[BaseException, float]:
    """stop_before_workers, composing through dagrl.main.compose (quoting, full key paths)."""
    from omegaconf import OmegaConf

    import dagrl.trainer.setup as setup
    from dagrl.main import compose, run

    monkeypatch.setattr(setup, "launch", lambda *a, **k: pytest.fail(f"workers were started for {overrides}"))
    start = time.perf_counter()
    with pytest.raises(DagrlError) as err:
        run(OmegaConf.to_object(compose([f"trainer.default_local_dir={out_dir}", *overrides])))
    return err.value, time.perf_counter() - start


@pytest.mark.parametrize("overrides, env, blocked, parts", ROUND3, ids=[" ".join(c[0])[:80] for c in ROUND3])
def test_round3_bad_value_stops_before_workers(
    overrides, env, blocked, parts, corpus3, monkeypatch, tmp_path
):
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, fill([value], corpus3)[0])
    for module in blocked:  # as if not installed: `import module` fails, find_spec finds nothing
        monkeypatch.setitem(sys.modules, module, None)
    error, seconds = stop_as_the_cli_does(fill(overrides, corpus3), monkeypatch, tmp_path / "out")
    message = str(error)
    assert "\n" not in message, message
    for part in fill(parts, corpus3):
        assert part in message, f"{part!r} not in: {message}"
    assert seconds < 60, seconds  # the first case to read data pays for importing the tokenizer
    print(f"seconds to the message: {seconds:.3f}")  # docs/reliability.md's figures (pytest -s)


@pytest.mark.parametrize(
    "override, value",
    [
        ('trainer.default_local_dir="/runs/lr=1e-6,bs=64"', "/runs/lr=1e-6,bs=64"),
        ("trainer.default_local_dir='/runs/a b [x] {y}'", "/runs/a b [x] {y}"),
        ("trainer.default_local_dir=/runs/lr=1e-6", "/runs/lr=1e-6"),  # a plain path, unquoted
        ("trainer.default_local_dir=/runs/a[0]{b}", "/runs/a[0]{b}"),
        ("trainer.default_local_dir=./runs/lr=1e-6", "./runs/lr=1e-6"),
        ("data.train_files=~/d/x=1.parquet", "~/d/x=1.parquet"),
        ("trainer.default_local_dir=~/runs", "~/runs"),  # Hydra alone refuses a leading ~
        ("+trainer.experiment_name=../lr=3", "../lr=3"),
    ],
)
def test_quoted_values_and_plain_paths_are_read_as_written(override, value):
    from omegaconf import OmegaConf

    from dagrl.main import compose

    key = override.lstrip("+").split("=")[0]
    assert OmegaConf.select(compose([override]), key) == value


@pytest.mark.parametrize(
    "text",
    [
        "trainer.default_local_dir=runs/lr=1",  # not plainly a path: no leading / ~ ./ ../
        "trainer.default_local_dir=/runs/$x=1",  # $: Hydra's interpolation inside quotes
        "trainer.default_local_dir=/runs/a\\b=1",
        "trainer.default_local_dir=/runs/a'b=1",
        "trainer.default_local_dir=/runs/a,b=1",
        "trainer.total_epochs=/1=2",  # not a string key
        "trainer.no_such_key=/a=b",
    ],
)
def test_plain_path_rule_takes_nothing_else(text):
    from dagrl.config.override_values import plain_path

    assert plain_path(text) is None
    assert plain_path("trainer.default_local_dir=/runs/lr=1") == "trainer.default_local_dir='/runs/lr=1'"


def test_loggers_start_with_credentials_or_offline(tmp_path, monkeypatch):
    from dagrl.trainer.logger import check_loggers

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(DagrlError, match="WANDB_MODE=offline"):
        check_loggers(["wandb"])
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    check_loggers(["console", "tensorboard", "wandb"])  # `wandb login` wrote this
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_loggers(["wandb"])
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    check_loggers(["wandb"])


def test_ray_address_auto_resolves_as_ray_does(tmp_path, monkeypatch):
    from dagrl.trainer.preflight import resolve_ray_address

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert resolve_ray_address("auto") == "10.0.0.1:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.2:6379\n")
    assert resolve_ray_address("auto") == "10.0.0.2:6379"
    assert resolve_ray_address(None) is None and resolve_ray_address("local") == "local"
    assert resolve_ray_address("10.0.0.3:1") == "10.0.0.3:1"
