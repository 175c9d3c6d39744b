"""The one-GPU acceptance matrix: GRPO with the defaults at real sizes, as rows of docs/gpu_acceptance.md.

Each row is `python -m dagrl.main` as a user types it: a random-weight Qwen3 shape
(tools/random_qwen3.py, no download), `rollout.name=vllm` and only the model, data and lengths
besides (bench/real_size_gpu.py's overrides: built-in prompts, full-length responses and a length
reward so the weights move). Per row it prints one `ROW {...}` JSON line and appends the table row
to OUT/rows.md:

- rc, steps done, median step seconds (steps 2..N), the update's grad norm (non-zero: weights move);
- the measured per-phase device peak (`torch.cuda.mem_get_info`, sampled at the end of the rollout
  and of the update: `rollout/` and `update/device_memory_used_gib`), max over the steps;
- the plan's figure for the same phases (the dry run's memory table);
- the hand-over samples (`memory/to_<role>/in_use_gib`): their spread over steps 2..N is the
  leak check (flat within 1 GiB).

    python bench/gpu_matrix.py OUT 0.6b-32x8x256 4b-torch ...     (names: see ROWS, COMMAND_ROWS, CARD_ROWS)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_size_gpu import REPO, build, run_command  # noqa: E402
from real_size_gpu import overrides as real_size_overrides  # noqa: E402

# name -> (shape, setup, prompts, n, prompt length, response length, steps)
ROWS = {
    "0.6b-32x8x256": ("0.6b", "torch", 32, 8, 128, 256, 20),
    "0.6b-64x8x512": ("0.6b", "torch", 64, 8, 128, 512, 10),
    "1.7b-torch": ("1.7b", "torch", 16, 4, 128, 512, 10),
    "4b-torch": ("4b", "torch", 16, 4, 160, 512, 10),
    "4b-megatron": ("4b", "megatron", 16, 4, 160, 512, 10),
    "8b-megatron": ("8b", "megatron", 16, 4, 160, 512, 10),
    # the torch backend at 8B full parameters: the optimizer on the host (16 bytes a parameter; the
    # plan keeps 159.3 GiB there with the sleeping engine's weights): a row for the 2x/4x hosts; one
    # H200 machine's 126 GiB refuses it before any GPU is taken (session 34)
    "8b-torch": ("8b", "torch", 16, 4, 160, 512, 10),
    # issue 31's acceptance: Qwen3-8B shape, LoRA rank 64, colocated vLLM, one H100, 10 steps
    "8b-torch-lora": ("8b", "torch-lora", 16, 4, 160, 512, 10),
    "8b-megatron-lora": ("8b", "megatron-lora", 16, 4, 160, 512, 10),
}
# name -> (the row it runs, the card it stands for in GiB): that row with trainer.gpu_memory_gib
# set to the smaller card's size (the plan chooses for it; the engines take their shares of it) and
# a ballast process holding the rest of the device through the run, so the run has the smaller
# card's memory: an H100 80 GB's 79.2 GiB on an H200 (both Hopper: the same kernels, so the same
# memory; the step seconds are the H200's). The row's device figures are the card's in use less
# the ballast's allocation (its CUDA context, ~0.5 GiB, stays in them: an H100 has none).
CARD_ROWS = {"4b-megatron-80gib": ("4b-megatron", 79.2)}
# rows whose plan keeps 32 GiB or more on the host (the dry run's `host memory of node 0` line; the
# bench tests check this set against every row's dry run): at most one of them a call of
# bench/acceptance_slots.sh. Two of them did not fit a 251 GiB host (8b-torch, 152.6 GiB planned and
# 161.8 resident, beside 4b-megatron-80gib's 67.4 planned: Ray's memory monitor ended both in step
# 1's update, 2x H200, 2026-11-28).
HOST_HEAVY = {"8b-torch", "8b-megatron", "4b-megatron-80gib"}
HOST_LINE = re.compile(r"^\s+host memory of node 0: ([\d.]+) GiB", re.M)
PHASE_LINE = re.compile(r"^\s{4}(\w+)\s+([\d.]+)(?:\s+OVER)?\s+=")
STAGES_LINE = re.compile(r"^\s{6}\w+'s pipeline stages, first to last: ([\d., ]+)$", re.M)
STAGE_KEY = re.compile(r"^update/stage(\d+)_device_memory_used_gib$")


def overrides(shape_dir: str, run_dir: str, plugin: str, row: tuple) -> list[str]:
    """real_size_gpu.py's command line for a row: the same run, the row's sizes."""
    _, setup, prompts, n, prompt, response, steps = row
    args = SimpleNamespace(
        setup=setup, prompts=prompts, n=n, prompt=prompt, response=response, steps=steps, overrides=[]
    )
    return real_size_overrides(args, shape_dir, run_dir, plugin)


def plan_host_gib(stdout: str) -> float:
    """The dry run's host memory of node 0 in GiB (0 when the plan keeps nothing there)."""
    m = HOST_LINE.search(stdout)
    return float(m.group(1)) if m else 0.0


def plan_phases(stdout: str) -> dict[str, float]:
    """The dry run's memory table: phase -> GiB per device (the largest group's)."""
    out: dict[str, float] = {}
    for line in stdout.splitlines():
        m = PHASE_LINE.match(line)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0.0), float(m.group(2)))
    return out


def stage_figures(stdout: str, rows: list[dict]) -> dict | None:
    """Under PP: the plan's update per pipeline stage (the dry run's stages line, the largest
    group's) beside the run's (`update/stage<k>_device_memory_used_gib`, the largest over the
    steps), both first stage to last; a stage the run did not log is None in its place (before
    each stage's cards were gathered, only the last stage's was). None when the row has no pipeline."""
    planned = [[float(v) for v in m.split(",")] for m in STAGES_LINE.findall(stdout)]
    seen: dict[int, float] = {}
    for row in rows:
        for key, value in row.items():
            if m := STAGE_KEY.match(key):
                seen[int(m.group(1))] = max(seen.get(int(m.group(1)), 0.0), value)
    if not planned and not seen:
        return None
    plan = max(planned, key=max) if planned else None
    stages = max(len(plan or ()), max(seen, default=-1) + 1)
    return {
        "plan": plan,
        "peak": [round(seen[k], 2) if k in seen else None for k in range(stages)] if seen else None,
    }


# the other one-GPU rows: a documented run as users type it, 10 steps (run dir -> command, metrics)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
SHORT = ["trainer.device=cuda", "trainer.progress_bar=false", "trainer.save_freq=-1"]


def gkd_row(run_dir: str) -> tuple[list[str], str]:
    """ms-swift's colocate/colocate GKD YAML through run.sh: a 0.6B student, a 1.7B teacher."""
    student, teacher = build(MODELS, "0.6b"), build(MODELS, "1.7b")
    yaml = os.path.join(REPO, "examples/ms_swift/rollout_colocate_teacher_colocate.yaml")
    cmd = ["bash", os.path.join(REPO, "run_scripts/gkd/run.sh"), yaml, f"model={student}",
           f"teacher_model={teacher}", "trainer.total_training_steps=10", f"trainer.default_local_dir={run_dir}",
           "trainer.val_before_train=false", "trainer.test_freq=-1", "data.max_prompt_length=128",
           "data.max_response_length=256", "actor_rollout_ref.rollout.ignore_eos=true", *SHORT]  # fmt: skip
    return cmd, os.path.join(run_dir, "metrics.jsonl")


def calculator_row(run_dir: str) -> tuple[list[str], str]:
    """The multi-turn calculator example with the vLLM rollout (its own tiny model and tool)."""
    cmd = [sys.executable, "-m", "dagrl.main", "experiment=multi_turn/calculator", "actor_rollout_ref.rollout.name=vllm",
           "trainer.total_training_steps=10", f"trainer.default_local_dir={run_dir}", *SHORT]  # fmt: skip
    return cmd, os.path.join(run_dir, "metrics.jsonl")


def sample_row(run_dir: str) -> tuple[list[str], str]:
    """pipeline=sample: the vLLM sampler and an outcome reward model (0.6B shapes), 4 shards."""
    from sample_gpu import build_reward_model

    policy = build(MODELS, "0.6b")
    out_dir = os.path.join(run_dir, "samples")
    cmd = [sys.executable, "-m", "dagrl.main", "pipeline=sample", f"actor_rollout_ref.model.path={policy}",
           "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.name=vllm",
           "actor_rollout_ref.rollout.ignore_eos=true", "actor_rollout_ref.rollout.n=8",
           "data.max_response_length=512", f"sample.output_dir={out_dir}", "sample.shard_size=64",
           "sample.max_prompts=256", "sample.filter=best_of_n", f"sample.orm_model={build_reward_model(policy, run_dir)}",
           f"trainer.default_local_dir={run_dir}", *SHORT]  # fmt: skip
    return cmd, os.path.join(out_dir, "metrics.jsonl")


COMMAND_ROWS = {"gkd-0.6b-1.7b": gkd_row, "calculator-vllm": calculator_row, "sample-vllm-rm": sample_row}
MODELS = "/tmp/dagrl_models"


def row_command(name: str, run_dir: str) -> tuple[list[str], dict, str]:
    """A row's command, its environment and where its metrics land."""
    if name in COMMAND_ROWS:
        cmd, metrics = COMMAND_ROWS[name](run_dir)
        return cmd, ENV, metrics
    if name in CARD_ROWS:
        base, card_gib = CARD_ROWS[name]
        cmd, env, metrics = row_command(base, run_dir)
        return cmd + [f"trainer.gpu_memory_gib={card_gib}"], env, metrics
    row = ROWS[name]
    model = build(MODELS, row[0])
    cmd, env = run_command(run_dir, lambda plugin: overrides(model, run_dir, plugin, row))
    return cmd, env, os.path.join(run_dir, "metrics.jsonl")


# the ballast: holds all but `card` GiB of the device (GPU 0 of its CUDA_VISIBLE_DEVICES, the row's
# card), prints what it holds, and lets go when its stdin closes
BALLAST = """
import json, sys, torch
total = torch.cuda.get_device_properties(0).total_memory
free = torch.cuda.mem_get_info()[0]
held = torch.empty(max(0, int(total - float(sys.argv[1]) * 2**30)), dtype=torch.uint8, device="cuda")
after = torch.cuda.mem_get_info()[0]
print(json.dumps({"held_gib": (free - after) / 2**30, "context_gib": (total - free) / 2**30}), flush=True)
sys.stdin.read()
"""


class Ballast:
    """`with Ballast(card_gib) as held:` the device less `card_gib` held by another process for the
    block; `held` = {"held_gib", "context_gib"} (the ballast's allocation; its context and the
    driver's share before it)."""

    def __init__(self, card_gib: float):
        self.card_gib = card_gib

    def __enter__(self) -> dict:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BALLAST, str(self.card_gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(
                f"the ballast for a {self.card_gib} GiB card did not start (rc {self.proc.returncode})"
            )
        return json.loads(line)

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def less_held(rows: list[dict], held_gib: float) -> list[dict]:
    """The runs' device figures (the card's in use: total - free) less what the ballast held."""
    suffixes = ("device_memory_used_gib", "in_use_gib")
    return [{k: round(v - held_gib, 4) if k.endswith(suffixes) else v for k, v in r.items()} for r in rows]


USED_LINE = re.compile(r"^cluster: .*, (\d+) used$", re.M)
# per-step figures a row reports as their median over steps 2..N (multi-GPU rows: bench/multi_gpu_rows.py)
MEDIAN_KEYS = (
    "timing_s/", "weight_sync/", "rollout_corr/logprob_abs_diff", "perf/", "teacher/", "rollout/tokens_per_s",
    "rollout/generate_s", "rollout/alloc_retries", "rollout/device_mallocs", "rollout/device_frees",
    "update/alloc_retries", "update/device_mallocs", "update/device_frees",
)  # fmt: skip


# bench/acceptance_slots.sh runs groups beside each other on one host: it names the slot, and the
# time (epoch seconds) by which the slot's groups must be done
SLOT, DEADLINE = os.environ.get("ACCEPTANCE_SLOT"), os.environ.get("ACCEPTANCE_DEADLINE")
ROW_RESERVE_S = 10  # what a row needs after its run: reading metrics, writing its row


def time_left(limit: float) -> tuple[float, bool]:
    """(seconds a run may take, whether the slot's deadline set them rather than `limit`)."""
    if not DEADLINE:
        return limit, False
    left = float(DEADLINE) - time.time() - ROW_RESERVE_S
    return (left, True) if left < limit else (limit, False)


def this_host(cmd: list[str]) -> list[str]:
    """The override that gives a dry run this machine's memory, as the real run takes it
    (trainer/capacity.py: a dry run has no host figure of its own). Its auto choices follow the
    host (the 8B megatron's optimizer share on the host: 0.6 on a 126 GiB machine, 1.0 on a larger
    one), so the row's plan column is the plan its run ran."""
    if any(arg.startswith("trainer.host_memory_gib=") for arg in cmd):
        return []
    return [f"trainer.host_memory_gib={os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30!r}"]


def run_row(out: str, name: str, timeout: int, command=None) -> dict:
    """Dry-run then run one row; command(name, run_dir) -> (argv, env, metrics path), row_command
    unless given. The run gets `timeout` seconds, fewer where a slot's deadline comes first."""
    run_dir = tempfile.mkdtemp(prefix=f"{name}_")  # under TMPDIR: a slot's own
    cmd, env, metrics = (command or row_command)(name, run_dir)
    dry_cmd = cmd + ["trainer.dry_run=true"] + this_host(cmd)
    dry = subprocess.run(dry_cmd, env=env, capture_output=True, text=True, cwd=REPO)
    plan = plan_phases(dry.stdout)
    used = USED_LINE.findall(dry.stdout)
    timeout, by_deadline = time_left(timeout)
    start = time.perf_counter()
    log = os.path.join(out, f"{name}.log")
    ballast = Ballast(CARD_ROWS[name][1]) if name in CARD_ROWS else contextlib.nullcontext({})
    with ballast as held:
        try:
            with open(log, "w") as f:
                rc = subprocess.run(
                    cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, timeout=max(timeout, 1)
                ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    rows = []
    if os.path.isfile(metrics):
        rows = [json.loads(ln) for ln in open(metrics) if ln.strip()]
    rows = less_held([r for r in rows if "timing_s/step" in r], held.get("held_gib", 0.0))
    steps = [r["timing_s/step"] for r in rows]
    later = steps[1:] or steps
    peaks = {
        phase: round(max(r.get(f"{phase}/device_memory_used_gib", 0.0) for r in rows), 2) if rows else None
        for phase in ("rollout", "update")
    }
    handover = {}  # memory/to_<role>/in_use_gib: spread over steps 2..N
    for key in sorted(
        {k for r in rows for k in r if k.startswith("memory/to_") and k.endswith("in_use_gib")}
    ):
        seen = [r[key] for r in rows[1:] if key in r]
        if seen:
            point = key[: -len("in_use_gib")]  # with the allocator's view: what holds the memory
            handover[key] = {
                "min": round(min(seen), 2),
                "max": round(max(seen), 2),
                "allocated": round(max(r.get(point + "allocated_gib", 0.0) for r in rows[1:]), 2),
                "reserved": round(max(r.get(point + "reserved_gib", 0.0) for r in rows[1:]), 2),
            }
    tail = open(log).read().strip().splitlines()[-3:] if rc else []
    result = {
        "row": name,
        "rc": rc,
        "steps": len(steps),
        "median_step_s": round(sorted(later)[len(later) // 2], 2) if later else None,
        "last3_s": [round(s, 2) for s in steps[-3:]],
        "grad_norm": [round(r.get("actor/grad_norm", 0.0), 4) for r in rows[:1] + rows[-1:]],
        # what the row learns, first and last step: divergence (GKD), reward (GRPO, multi-turn, samples)
        "first_last": {
            k: [round(rows[0][k], 4), round(rows[-1][k], 4)]
            for k in sorted(rows[0] if rows else {})
            if k in rows[-1]
            and isinstance(rows[0][k], float)
            and ("loss" in k or "reward/mean" in k or "divergence" in k or "score" in k)
        },
        "step1": {
            k: rows[0][k] for k in ("actor/pg_loss", "actor/grad_norm", "actor/loss") if rows and k in rows[0]
        },
        "median": medians(rows[1:] or rows),
        "gpus": int(used[-1]) if used else None,
        "metrics": metrics,
        "peak_gib": peaks,
        "plan_gib": {p: plan.get(p) for p in ("rollout", "update")},
        # the host: the plan's figure for the node, the update's process resident at its end and
        # its high-water mark (perf/host_rss_gib, perf/host_peak_rss_gib), the largest over the steps
        "host_gib": {
            "plan": plan_host_gib(dry.stdout),
            "rss": round(max((r.get("perf/host_rss_gib", 0.0) for r in rows), default=0.0), 2),
            "peak": round(max((r.get("perf/host_peak_rss_gib", 0.0) for r in rows), default=0.0), 2),
        },
        # every planned phase's figure beside the run's (teacher, ref_logprob, ...: where the run logs one)
        "phases_gib": {
            p: [
                v,
                max(
                    (r[f"{p}/device_memory_used_gib"] for r in rows if f"{p}/device_memory_used_gib" in r),
                    default=None,
                ),
            ]
            for p, v in plan.items()
        },
        # devices per role: the plan's groups and where each pool's ranks landed
        "plan_groups": [ln for ln in dry.stdout.splitlines() if ln.startswith("group ")],
        "placed": [ln for ln in open(log).read().splitlines() if ln.startswith("placed ")],
        "handover": handover,
        "stages_gib": stage_figures(dry.stdout, rows),  # under PP: the update per stage, plan and run
        "wall_s": round(time.perf_counter() - start, 1),
        "tail": [t[-300:] for t in tail],
        "cut_by_deadline": rc == 124 and by_deadline,
    }
    result["device"] = card_name()
    if held:
        result["ballast"] = {k: round(v, 2) for k, v in held.items()}
        result["device"] += f" held to {CARD_ROWS[name][1]} GiB"
    if result["gpus"] and result["gpus"] > 1:  # the card count names a multi-GPU row's device
        result["device"] = f"{result['gpus']}× {result['device']}"
    return result


def card_name() -> str:
    """The first card's name from nvidia-smi, not torch: a CUDA context of this process would sit
    on card 0 through the next row's run."""
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        )
    except OSError:  # no driver here
        return "?"
    names = smi.stdout.strip().splitlines()
    return names[0] if smi.returncode == 0 and names else "?"


def medians(rows: list[dict]) -> dict[str, float]:
    """The median of each MEDIAN_KEYS figure over `rows` (the steps after the first)."""
    keys = {k for r in rows for k, v in r.items() if k.startswith(MEDIAN_KEYS) and type(v) in (int, float)}
    out = {}
    for key in sorted(keys):
        seen = sorted(r[key] for r in rows if key in r)
        out[key] = round(seen[len(seen) // 2], 4)
    return out


def table_row(r: dict) -> str:
    peak = " / ".join(f"{r['peak_gib'][p]}" for p in ("rollout", "update"))
    plan = " / ".join(f"{r['plan_gib'][p]}" for p in ("rollout", "update"))
    steps = f"{r['steps']}, cut by the deadline" if r.get("cut_by_deadline") else r["steps"]
    return f"| {r['row']} | {r['device']} | {r['rc']} | {steps} | {r['median_step_s']} | {peak} | {plan} |"


# a row started with less time than this left before the slot's deadline could not finish its
# dry run and engine start: it is recorded as not started instead
MIN_ROW_S = 60


def not_started(out: str, names: list[str]) -> list[str]:
    """The rows of `names` there is no time left for (each recorded as such), and the rest."""
    left, by_deadline = time_left(MIN_ROW_S)
    if not by_deadline:
        return names
    with open(os.path.join(out, "rows.md"), "a") as f:
        for name in names:
            f.write(
                f"| {name} | {card_name()} | 124 | not started: {left:.0f} s left before the deadline | | | |\n"
            )
    print(f"NOT STARTED {names}: {left:.0f} s left before the slot's deadline", flush=True)
    return []


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    timeout = int(os.environ.get("ROW_TIMEOUT", "420"))
    for i, name in enumerate(names):
        if not not_started(out, names[i:]):
            break
        record(out, run_row(out, name, timeout))


def record(out: str, result: dict) -> None:
    """A row's ROW line, its table row in OUT/rows.md, and nothing left running for the next row
    (`ray stop`: every Ray on the host, so not beside other slots, whose runs' local Rays end with
    their own processes)."""
    print("ROW " + json.dumps(result), flush=True)
    with open(os.path.join(out, "rows.md"), "a") as f:
        f.write(table_row(result) + "\n")
    if not SLOT:
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


if __name__ == "__main__":
    main()
