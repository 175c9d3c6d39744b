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

    python bench/gpu_matrix.py OUT 0.6b-32x8x256 4b-torch ...     (names: see ROWS)
"""

from __future__ import annotations

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
    # issue 31's acceptance: Qwen3-8B shape, LoRA rank 64, colocated vLLM, one H100, 10 steps
    "8b-torch-lora": ("8b", "torch-lora", 16, 4, 160, 512, 10),
    "8b-megatron-lora": ("8b", "megatron-lora", 16, 4, 160, 512, 10),
}
PHASE_LINE = re.compile(r"^\s{4}(\w+)\s+([\d.]+)(?:\s+OVER)?\s+=")


def overrides(shape_dir: str, run_dir: str, plugin: str, row: tuple) -> list[str]:
    """real_size_gpu.py's command line for a row: the same run, the row's sizes."""
    _, setup, prompts, n, prompt, response, steps = row
    args = SimpleNamespace(
        setup=setup, prompts=prompts, n=n, prompt=prompt, response=response, steps=steps, overrides=[]
    )
    return real_size_overrides(args, shape_dir, run_dir, plugin)


def plan_phases(stdout: str) -> dict[str, float]:
    """The dry run's memory table: phase -> GiB per device (the largest group's)."""
    out: dict[str, float] = {}
    for line in stdout.splitlines():
        m = PHASE_LINE.match(line)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0.0), float(m.group(2)))
    return out


def run_row(out: str, name: str, timeout: int) -> dict:
    row = ROWS[name]
    model = build("/tmp/dagrl_models", row[0])
    run_dir = tempfile.mkdtemp(prefix=f"{name}_", dir="/tmp")
    cmd, env = run_command(run_dir, lambda plugin: overrides(model, run_dir, plugin, row))
    dry = subprocess.run(cmd + ["trainer.dry_run=true"], env=env, capture_output=True, text=True, cwd=REPO)
    plan = plan_phases(dry.stdout)
    start = time.perf_counter()
    log = os.path.join(out, f"{name}.log")
    try:
        with open(log, "w") as f:
            rc = subprocess.run(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout
            ).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    rows = []
    if os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        rows = [json.loads(ln) for ln in open(os.path.join(run_dir, "metrics.jsonl")) if ln.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
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
        "peak_gib": peaks,
        "plan_gib": {p: plan.get(p) for p in ("rollout", "update")},
        "handover": handover,
        "wall_s": round(time.perf_counter() - start, 1),
        "tail": [t[-300:] for t in tail],
    }
    try:
        import torch

        result["device"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 (the figure is optional)
        result["device"] = "?"
    return result


def table_row(r: dict) -> str:
    peak = " / ".join(f"{r['peak_gib'][p]}" for p in ("rollout", "update"))
    plan = " / ".join(f"{r['plan_gib'][p]}" for p in ("rollout", "update"))
    return (
        f"| {r['row']} | {r['device']} | {r['rc']} | {r['steps']} | {r['median_step_s']} | {peak} | {plan} |"
    )


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    timeout = int(os.environ.get("ROW_TIMEOUT", "420"))
    for name in names:
        result = run_row(out, name, timeout)
        print("ROW " + json.dumps(result), flush=True)
        with open(os.path.join(out, "rows.md"), "a") as f:
            f.write(table_row(result) + "\n")
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


if __name__ == "__main__":
    main()
