"""The two- and four-GPU acceptance rows (issues 30 and 34) as rows of docs/gpu_acceptance.md.

Each row is a command as a user types it (`python -m dagrl.main`, `run_scripts/gkd/run.sh` with
ms-swift's YAMLs, siiRL's `run_scripts/run_qwen3-8b-megatron.sh`), on random-weight Qwen3 shapes
(bench/real_size_gpu.py's SHAPES), with CUDA_VISIBLE_DEVICES naming the cards it may use. Rows run
through bench/gpu_matrix.py's run_row (dry-run plan, run, per-phase peaks, hand-overs); besides its
columns a row's `ROW {...}` line carries step 1's loss and grad norm and the median over steps 2..N
of the weight sync, log-prob mismatch, per-phase seconds, tokens/s and TFLOPs per GPU.

    python bench/multi_gpu_rows.py OUT ROW...          (names: ROWS; groups: bench/acceptance_multi_gpu.sh)
    python bench/multi_gpu_rows.py --compare DIR A B   (A's and B's per-step figures side by side;
                                                        DIR holds their JSON: OUT, or KEEP below)

tests/bench/test_multi_gpu_rows.py dry-runs every row's command on the CPU with config-only shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_matrix import SHORT, not_started, record, run_row  # noqa: E402
from real_size_gpu import REPO, run_command  # noqa: E402
from real_size_gpu import overrides as real_size_overrides  # noqa: E402

MODELS = "/tmp/dagrl_models"
A, R, MEGA = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.megatron"
# bf16 dense peak of one H100 / H200 SXM (TFLOP/s): MFU = the update's TFLOPs per GPU over this
PEAK_TFLOPS = 989.0
SWIFT = os.path.join(REPO, "examples", "ms_swift")
RESUME_DIR = "/tmp/mg_8b_resume"
# every row's JSON also lands here: each device call has an OUT of its own, and a later call on the
# same (warm) machine compares with an earlier one's rows (pp with tp's one-GPU run, resume with mega8b)
KEEP = os.environ.get("MULTI_GPU_KEEP", "/tmp/dagrl_multi_gpu_rows")
# host memory the kernel reports on the lent machines (GiB; 2 GPUs: 256 nominal, 4: 512, 8: 560)
HOST_GIB = {1: 251, 2: 251, 4: 503, 8: 550}  # the save-at-5 and resume-to-10 rows share their run directory


@dataclass
class GrpoRow:
    """GRPO through real_size_gpu's overrides: a shape, its sizes and the layout keys."""

    gpus: int
    shape: str
    setup: str = "torch"
    prompts: int = 32
    n: int = 8
    prompt: int = 128
    response: int = 256
    steps: int = 10
    extra: tuple[str, ...] = ()


@dataclass
class SwiftRow:
    """ms-swift's GKD YAML through run_scripts/gkd/run.sh, sized by overrides (the file as shipped)."""

    gpus: int
    yaml: str
    student: str
    teacher: str
    extra: tuple[str, ...] = ()
    steps: int = 10


@dataclass
class ScriptRow:
    """siiRL's Qwen3-8B megatron script: only paths, parallel sizes and the run's length change."""

    gpus: int
    env: dict[str, str] = field(default_factory=dict)
    run_dir: str | None = None  # a fixed directory (save then resume); None: the row's own


def _layout(gpus: int, *keys: str) -> tuple[str, ...]:
    return (f"trainer.n_gpus_per_node={gpus}", *keys)


TP2 = (f"{A}.strategy=megatron", f"{MEGA}.tensor_model_parallel_size=2", f"{R}.tensor_model_parallel_size=2")
TP2_SP = (*TP2, f"{MEGA}.sequence_parallel=true")
LOGPROBS = (f"{R}.calculate_log_probs=true",)  # the rollout_corr/* mismatch metrics
SCRIPT_RUN = {
    "TRAIN_BATCH_SIZE": "16",
    "PPO_MINI_BATCH_SIZE": "16",
    "ROLLOUT_N": "8",
    "MAX_PROMPT_LENGTH": "256",
    "MAX_RESPONSE_LENGTH": "512",
    "TP": "2",
    "PP": "2",
    "N_GPUS_PER_NODE": "4",
    "TEST_FREQ": "-1",
    "LOGGER": "[console]",
}

ROWS: dict[str, GrpoRow | SwiftRow | ScriptRow] = {
    # issue 30: two GPUs, 0.6B GRPO at the README's 32 x 8 x 256 unless said
    # the engine's log-probs asked for (auto leaves them off): the separate rows' mismatch beside the
    # colocated one's; dp2 and dp4 as their 1g reference does (a scaling ratio of the same work)
    "1g-0.6b-colocate": GrpoRow(1, "0.6b", extra=LOGPROBS),
    "2g-0.6b-separate": GrpoRow(2, "0.6b", extra=_layout(2, "placement=separate", *LOGPROBS)),
    "2g-0.6b-separate-overlap": GrpoRow(
        2, "0.6b", extra=_layout(2, "placement=separate", f"{R}.overlap_steps=1", *LOGPROBS)
    ),
    "2g-0.6b-dp2": GrpoRow(2, "0.6b", prompts=64, extra=_layout(2, *LOGPROBS)),
    "1g-0.6b-megatron": GrpoRow(1, "0.6b", "megatron"),
    "2g-0.6b-megatron-tp2-sp": GrpoRow(2, "0.6b", "megatron", extra=_layout(2, *TP2_SP)),
    "2g-0.6b-megatron-pp2": GrpoRow(2, "0.6b", "megatron", extra=_layout(2, f"{MEGA}.pipeline_model_parallel_size=2")),
    "2g-gkd-colocate": SwiftRow(
        2, "rollout_colocate_teacher_colocate", "0.6b", "1.7b",
        _layout(2, "placement.gpus.train=2", "placement.gpus.rollout=2"),
    ),
    "2g-gkd-separate": SwiftRow(2, "rollout_separate_teacher_colocate", "0.6b", "1.7b"),
    "2g-gkd-standalone": SwiftRow(2, "rollout_colocate_teacher_standalone", "0.6b", "1.7b"),
    "2g-8b-megatron-tp2": GrpoRow(2, "8b", "megatron", 16, 4, 160, 512, extra=_layout(2, *TP2_SP)),
    # the engine drops its weights while asleep (sleep_level 2): with them kept on the host the plan
    # holds 248 GiB there, over 90 % of a 2x H200 host's 251 (and a real run refuses it)
    "2g-14b-megatron-tp2": GrpoRow(
        2, "14b", "megatron", 16, 4, 160, 512,
        extra=_layout(2, *TP2_SP, "trainer.gpu_memory_gib=141", f"{R}.sleep_level=2"),
    ),
    # two raylets on one host, one card each (bench/acceptance_multi_gpu.sh two_nodes starts them)
    "2n-0.6b-separate": GrpoRow(
        2, "0.6b", extra=("trainer.ray_address=auto", "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "placement=separate", *LOGPROBS),
    ),
    # issue 34: four GPUs; GKD with a 1.7B student and a 4B teacher at ms-swift's seed counts
    "4g-gkd-colocate-top64": SwiftRow(
        4, "rollout_colocate_teacher_colocate", "1.7b", "4b",
        _layout(4, "placement.gpus.train=4", "placement.gpus.rollout=4"),
    ),
    "4g-gkd-colocate-full": SwiftRow(
        4, "rollout_colocate_teacher_colocate", "1.7b", "4b",
        _layout(4, "placement.gpus.train=4", "placement.gpus.rollout=4", "algorithm.gkd.gkd_logits_topk=null"),
    ),
    "4g-gkd-separate": SwiftRow(
        4, "rollout_separate_teacher_colocate", "1.7b", "4b",
        _layout(4, "placement.gpus.train=2", "placement.gpus.rollout=2"),
    ),
    "4g-gkd-standalone": SwiftRow(
        4, "rollout_colocate_teacher_standalone", "1.7b", "4b",
        _layout(4, "placement.gpus.train=2", "placement.gpus.rollout=2", "teacher.gpus=2"),
    ),
    "4g-8b-tp2pp2": ScriptRow(4, {"TOTAL_STEPS": "10", "SAVE_FREQ": "-1"}),
    "4g-8b-tp2pp2-save5": ScriptRow(4, {"TOTAL_STEPS": "5", "SAVE_FREQ": "5"}, RESUME_DIR),
    "4g-8b-tp2pp2-resume10": ScriptRow(4, {"TOTAL_STEPS": "10", "SAVE_FREQ": "-1"}, RESUME_DIR),
    "4g-0.6b-dp4": GrpoRow(4, "0.6b", prompts=128, extra=_layout(4, *LOGPROBS)),  # as its 1g reference
}  # fmt: skip
# dry-run only: the eight-GPU TP2 x PP4 plan of the same script (its per-stage memory beside 4g's)
PLAN_ONLY = {"8g-8b-tp2pp4-plan": ScriptRow(8, {"PP": "4", "N_GPUS_PER_NODE": "8", "TOTAL_STEPS": "10"})}


def visible(gpus: int, inherited: str | None = None) -> str:
    """The row's cards: the first `gpus` of the list this process was given (a slot of
    bench/acceptance_slots.sh: `2,3` for a pair), else cards 0..gpus-1."""
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES") if inherited is None else inherited
    cards = [c for c in (inherited or "").split(",") if c.strip()] or [str(i) for i in range(gpus)]
    assert len(cards) >= gpus, f"a {gpus}-GPU row given CUDA_VISIBLE_DEVICES={inherited}"
    return "CUDA_VISIBLE_DEVICES=" + ",".join(cards[:gpus])


def grpo_command(row: GrpoRow, model, run_dir: str) -> tuple[list[str], dict]:
    args = SimpleNamespace(
        setup=row.setup, prompts=row.prompts, n=row.n, prompt=row.prompt, response=row.response,
        steps=row.steps, overrides=list(row.extra),
    )  # fmt: skip
    cmd, env = run_command(
        run_dir, lambda plugin: real_size_overrides(args, model(row.shape), run_dir, plugin)
    )
    return ["env", visible(row.gpus), *cmd], env


# The YAMLs' lr (1e-6, ms-swift's) moved a random 1.7B student's divergence from a random 4B teacher
# by 0.1-0.3 % in 10 steps on 4x H200 (2026-11-27), within the step-to-step noise for two of the
# four rows: the rows raise it so that "the divergence falls" can be read; nothing else depends on it.
GKD_LR = f"{A}.optim.lr=5e-5"


def swift_command(row: SwiftRow, model, run_dir: str) -> list[str]:
    """`CUDA_VISIBLE_DEVICES=.. bash run_scripts/gkd/run.sh FILE model=.. teacher_model=..` (the issue's form)."""
    return [
        "env", visible(row.gpus), "bash", os.path.join(REPO, "run_scripts/gkd/run.sh"),
        os.path.join(SWIFT, f"{row.yaml}.yaml"), f"model={model(row.student)}", f"teacher_model={model(row.teacher)}",
        f"trainer.total_training_steps={row.steps}", f"trainer.default_local_dir={run_dir}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "data.max_prompt_length=128",
        "data.max_response_length=256", f"{R}.ignore_eos=true", "trainer.logger=[console]", GKD_LR, *SHORT,
        *row.extra,
    ]  # fmt: skip


def script_command(row: ScriptRow, model, data: str, run_dir: str) -> list[str]:
    paths = {
        "MODEL_PATH": model("8b"),
        "TRAIN_FILE": os.path.join(data, "train.parquet"),
        "VAL_FILE": os.path.join(data, "test.parquet"),
        "CKPT_DIR": row.run_dir or run_dir,
    }
    env = [f"{k}={v}" for k, v in {**SCRIPT_RUN, **paths, **row.env}.items()]
    script = os.path.join(REPO, "run_scripts/run_qwen3-8b-megatron.sh")
    tail = ["trainer.val_before_train=false", f"{R}.ignore_eos=true", "trainer.progress_bar=false"]
    return ["env", visible(row.gpus), *env, "bash", script, *tail]


def built_model(shape: str) -> str:
    """A random-weight shape under MODELS, built by a process of its own: the weights are made on
    a GPU, and a CUDA context left in this process would sit on card 0 through the row's run."""
    path = os.path.join(MODELS, f"qwen3-{shape}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        code = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); from real_size_gpu import build; build({MODELS!r}, {shape!r})"
        subprocess.run([sys.executable, "-c", code], check=True)
    return path


def command(name: str, run_dir: str, model=None, data: str | None = None) -> tuple[list[str], dict, str]:
    """A row's argv, environment and metrics file; `model(shape)` gives a model directory (default:
    random weights built under MODELS), `data` the gsm8k parquet directory of the script rows."""
    model = model or built_model
    row = {**ROWS, **PLAN_ONLY}[name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    if isinstance(row, GrpoRow):
        cmd, env = grpo_command(row, model, run_dir)
    elif isinstance(row, SwiftRow):
        cmd = swift_command(row, model, run_dir)
    else:
        cmd = script_command(row, model, data or gsm8k_data(), run_dir)
        run_dir = row.run_dir or run_dir
    return cmd, env, os.path.join(run_dir, "metrics.jsonl")


def gsm8k_data(root: str = "/tmp/dagrl_gsm8k") -> str:
    """examples/data_preprocess/gsm8k.py's parquet from the test fixture rows (no download)."""
    from pathlib import Path

    sys.path.insert(0, REPO)
    from tests.data_preprocess.test_scripts import gsm8k_parquet

    if not os.path.isfile(os.path.join(root, "gsm8k", "train.parquet")):
        os.makedirs(root, exist_ok=True)
        gsm8k_parquet(Path(root))
    return os.path.join(root, "gsm8k")


def derived(result: dict) -> dict:
    """What the issue reads off a row: MFU per GPU, the sync's GB/s against its floor and where its
    time went (weight_sync/<phase>_ms), teacher tokens/s."""
    med = result.get("median", {})
    out = {}
    for key, value in med.items():
        if key.endswith("_tflops_per_gpu"):
            out[key.replace("_tflops_per_gpu", "_mfu")] = round(value / PEAK_TFLOPS, 4)
        if key.startswith("weight_sync/") and ("GBps" in key or key.endswith(("bytes", "_ms"))):
            out[key] = value
        if key.endswith("tokens_per_s"):
            out[key] = value
    return out


COMPARED = ("actor/pg_loss", "actor/grad_norm", "reward/mean", "actor/kl_loss", "actor/entropy")


def step_metrics(path: str) -> dict[int, dict]:
    """step -> the compared keys a run's metrics.jsonl logged ({} when the file is gone)."""
    rows = [json.loads(ln) for ln in open(path) if ln.strip()] if os.path.isfile(path) else []
    return {r["step"]: {k: r[k] for k in COMPARED if k in r} for r in rows if "step" in r}


def compare(out: str, first: str, second: str) -> dict:
    """Two rows' per-step loss, grad norm, reward, KL and entropy side by side (resume vs straight,
    TP vs one GPU): the largest relative gap per key (4 places) and whether every step is equal
    bit for bit. Random weights on gsm8k score 0, so loss and reward are 0 in both rows; grad
    norm, KL loss and entropy are what can differ there."""
    per_row = {}
    for name in (first, second):
        row = json.load(open(os.path.join(out, f"{name}.json")))
        kept = row.get("per_step")  # the row's own copy: its metrics file went with its call's slot
        per_row[name] = {int(s): v for s, v in kept.items()} if kept else step_metrics(row["metrics"])
    shared = sorted(set(per_row[first]) & set(per_row[second]))
    gaps, identical = {}, {}
    for key in COMPARED:
        pairs = [(per_row[first][s].get(key), per_row[second][s].get(key)) for s in shared]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs:
            gaps[key] = round(max(abs(a - b) / max(abs(a), abs(b), 1e-6) for a, b in pairs), 4)
            identical[key] = all(a == b for a, b in pairs)
    return {
        "compare": [first, second], "steps": shared, "max_rel_gap": gaps, "identical": identical, "rows": per_row
    }  # fmt: skip


def config_only_model(shape: str, root: str = MODELS + "_config") -> str:
    """A shape's config and tokenizer without weights: enough for a plan (no 16 GB build to dry-run)."""
    from real_size_gpu import SHAPES

    from tools.random_qwen3 import build_random_qwen3

    path = os.path.join(root, f"qwen3-{shape}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        build_random_qwen3(path, *SHAPES[shape], 151936, head_dim=128, config_only=True)
    return path


def plan_only(out: str, name: str) -> None:
    """A row that only plans (trainer.dry_run=true): its plan to OUT/NAME.plan, its row with the plan's GiB."""
    from gpu_matrix import USED_LINE, plan_phases

    cmd, env, _ = command(name, os.path.join(out, name), config_only_model)
    proc = subprocess.run(cmd + ["trainer.dry_run=true"], env=env, capture_output=True, text=True, cwd=REPO)
    with open(os.path.join(out, f"{name}.plan"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    plan, used = plan_phases(proc.stdout), USED_LINE.findall(proc.stdout)
    phases = " / ".join(f"{p} {v}" for p, v in plan.items())
    print(
        "PLAN " + json.dumps({"row": name, "rc": proc.returncode, "plan_gib": plan, "gpus": used}), flush=True
    )
    with open(os.path.join(out, "rows.md"), "a") as f:
        f.write(
            f"| {name} (dry run) | {used[-1] if used else '?'} GPUs planned | {proc.returncode} | 0 | | | {phases} |\n"
        )


def main() -> None:
    if sys.argv[1] == "--compare":
        print("COMPARE " + json.dumps(compare(*sys.argv[2:5])), flush=True)
        return
    out, names = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    timeout = int(os.environ.get("ROW_TIMEOUT", "480"))
    unknown = set(names) - set(ROWS) - set(PLAN_ONLY)
    assert not unknown, f"unknown rows {sorted(unknown)}; rows: {sorted(ROWS)} {sorted(PLAN_ONLY)}"
    for i, name in enumerate(names):
        if name in PLAN_ONLY:
            plan_only(out, name)
            continue
        if not not_started(out, [n for n in names[i:] if n not in PLAN_ONLY]):
            break
        result = run_row(out, name, timeout, command)
        result.update(derived(result))
        # the steps a later call compares with (pp with tp's one-GPU row, mega8b_resume with
        # mega8b): the metrics file is under the slot's TMPDIR, which the next call's slot empties
        result["per_step"] = step_metrics(result.get("metrics") or "")
        for where in (out, KEEP):  # KEEP: later calls on the same machine compare with this row
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, f"{name}.json"), "w") as f:
                json.dump(result, f)
        record(out, result)


if __name__ == "__main__":
    main()
