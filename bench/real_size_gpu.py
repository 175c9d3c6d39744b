"""GRPO at real model sizes on one GPU: `python -m dagrl.main` as a user runs it, colocated with vLLM.

Builds a random-weight Qwen3 shape (tools/random_qwen3.py, head_dim 128 as Qwen3 has it; no
download), prints the plan's per-phase estimate (the dry run), then trains --steps GRPO steps on
the built-in arithmetic problems, each filled out to exactly --prompt tokens (full_length_prompts),
with full-length responses (ignore_eos) and a length reward (so the advantages are not all zero and
the weights move): the run holds the token counts the plan counts. Prints one JSON line per run: exit code,
step seconds, per-phase timings, device memory in use per phase as the run logs it, the plan's
estimate per phase, and the update's grad norm and loss (non-zero: the weights move).

    python bench/real_size_gpu.py --shape 4b megatron-cpuopt     # Qwen3-4B, megatron, optimizer on the host
    python bench/real_size_gpu.py --shape 4b torch-cpuopt
    python bench/real_size_gpu.py --shape 1.7b torch             # the defaults
    python bench/real_size_gpu.py --shape 8b megatron-cpuopt     # one H200

A run that dies prints its last error line (the one-line engine error dagrl gives) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# hidden, layers, heads, kv heads, intermediate (vocabulary 151,936, head_dim 128; tied below 8B)
SHAPES = {
    "0.6b": (1024, 28, 16, 8, 3072),
    "1.7b": (2048, 28, 16, 8, 6144),
    "4b": (2560, 36, 32, 8, 9728),
    "8b": (4096, 36, 32, 8, 12288),
    "14b": (5120, 40, 40, 8, 17408),
}
A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
MEGA = f"{A}.megatron"
SETUPS = {
    "torch": (),  # the defaults: the plan picks recomputation, vLLM's pool, offload
    "torch-cpuopt": (f"{A}.optimizer_cpu_offload=true", f"{M}.gradient_checkpointing=true"),
    # LoRA rank 64 on every linear layer: frozen bf16 base, bf16 adapters with fp32 masters, merged
    # sync to the colocated vLLM (lora_sync auto)
    # (the engine's log-probs asked for: the rows report rollout_corr/logprob_abs_diff, the adapter
    # as the engine serves it against the trainer's)
    "torch-lora": (
        f"{M}.lora_rank=64",
        f"{M}.lora_alpha=128",
        f"{A}.optim.lr=1e-5",
        f"{R}.calculate_log_probs=true",
    ),
    "megatron": (f"{A}.strategy=megatron",),
    # the same LoRA on megatron's fused layers (backends/megatron/lora.py), merged sync (auto)
    "megatron-lora": (
        f"{A}.strategy=megatron",
        f"{M}.lora_rank=64",
        f"{M}.lora_alpha=128",
        f"{A}.optim.lr=1e-5",
        f"{R}.calculate_log_probs=true",
    ),
    "megatron-cpuopt": (
        f"{A}.strategy=megatron",
        f"{MEGA}.optimizer_cpu_offload=true",
        f"{MEGA}.optimizer_offload_fraction=1.0",
        f"{MEGA}.overlap_cpu_optimizer_d2h_h2d=true",
        f"{MEGA}.recompute_granularity=full",
        f"{MEGA}.recompute_method=uniform",
        f"{MEGA}.recompute_num_layers=1",
    ),
}
REWARD = """from dagrl.rewards.registry import register_reward


@register_reward("long_answer")
def long_answer(solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 1000.0
"""


def build(out: str, shape: str) -> str:
    """OUT/qwen3-SHAPE with random weights, built once per machine. Concurrent acceptance slots
    (bench/acceptance_slots.sh) share OUT: one builds while the others wait on the lock, and the
    directory appears whole (built aside, then renamed): config.json is written before the weights,
    so a build cut by a deadline would otherwise pass for a finished one."""
    import fcntl
    import shutil

    sys.path.insert(0, REPO)
    from tools.random_qwen3 import build_random_qwen3

    path = os.path.join(out, f"qwen3-{shape}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    os.makedirs(out, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not os.path.isfile(os.path.join(path, "config.json")):
            start, partial = time.perf_counter(), path + ".partial"
            shutil.rmtree(partial, ignore_errors=True)  # a build killed half-way
            shutil.rmtree(path, ignore_errors=True)  # an older non-atomic build's leftovers
            build_random_qwen3(partial, *SHAPES[shape], 151936, head_dim=128)
            os.rename(partial, path)
            print(json.dumps({"built": path, "s": round(time.perf_counter() - start, 1)}), flush=True)
    return path


def full_length_prompts(model: str, run_dir: str, length: int, rows: int) -> str:
    """RUN_DIR/prompts_LENGTH.parquet: `rows` built-in arithmetic problems, each followed by filler
    text of its own (random letters, so that vLLM's prefix cache shares no more than the chat
    template's header) until the prompt is exactly `length` tokens under the model's chat template,
    as dagrl tokenises it. The plan counts data.max_prompt_length for every prompt; the built-in
    problems alone are ~10 tokens, which left a third of the plan's update unused at 128 + 256
    (0.6b-32x8x256: 70.55 GiB measured against 84.22 planned on an H200, 2026-11-28)."""
    import random

    sys.path.insert(0, REPO)
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.builtin import generate_rows
    from dagrl.data.messages import render_messages
    from dagrl.data.writer import write_parquet

    path = os.path.join(run_dir, f"prompts_{length}.parquet")
    if os.path.isfile(path):  # a save/resume pair shares its run directory: the same rows
        return path
    tokenizer, letters = load_tokenizer(model), "abcdefghijklmnopqrstuvwxyz"
    out = generate_rows("train", rows, seed=1, teacher_prompts=False)
    for row in out:
        message, rng = row["prompt"][0], random.Random(row["extra_info"]["index"])
        question, filler = message["content"], ""
        for _ in range(8):  # one token per character with the shipped byte-level tokenizer: 1 pass
            short = length - len(
                render_messages(tokenizer, [{**message, "content": question + filler}], True)
            )
            if short == 0:
                break
            filler = (filler + "".join(rng.choice(letters) for _ in range(max(short, 0))))[
                : len(filler) + short
            ]
        else:
            raise ValueError(f"{model}: cannot fill a prompt to exactly {length} tokens ({question!r})")
        message["content"] = row["extra_info"]["question"] = question + filler
    os.makedirs(run_dir, exist_ok=True)
    write_parquet(out, path + ".partial")
    os.replace(path + ".partial", path)
    return path


def overrides(args, model: str, run_dir: str, plugin: str) -> list[str]:
    """The run's command-line keys; writes its prompts (full_length_prompts) into run_dir unless
    the extra overrides name data.train_files."""
    data = []
    if not any(o.startswith("data.train_files=") for o in args.overrides):
        rows = args.prompts * (args.steps + 1)
        data = [f"data.train_files={full_length_prompts(model, run_dir, args.prompt, rows)}"]
    return [
        f"{M}.path={model}",
        f"{M}.dtype=bfloat16",
        f"{A}.optim.lr=1e-6",
        "trainer.device=cuda",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
        f"data.train_batch_size={args.prompts}",
        f"{A}.ppo_mini_batch_size={args.prompts}",
        f"{R}.n={args.n}",
        f"data.max_prompt_length={args.prompt}",
        f"data.max_response_length={args.response}",
        *data,
        f"{R}.name=vllm",
        f"{R}.ignore_eos=true",
        f"external_plugins=[{plugin}]",
        "reward.functions=[{name: long_answer, weight: 1.0}]",
        *SETUPS[args.setup],
        *args.overrides,
    ]


def run_command(run_dir: str, make_overrides) -> tuple[list[str], dict]:
    """`python -m dagrl.main` for a run in `run_dir` (its length reward written there as a plugin;
    make_overrides(plugin path) -> overrides) and the environment that finds this checkout."""
    plugin = os.path.join(run_dir, "long_answer.py")
    with open(plugin, "w") as f:
        f.write(REWARD)
    cmd = [sys.executable, "-m", "dagrl.main", *make_overrides(plugin)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    return cmd, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("setup", choices=sorted(SETUPS))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=512)
    ap.add_argument("--out", default="/tmp/dagrl_real_size")
    ap.add_argument("--timeout", type=int, default=540)
    ap.add_argument("overrides", nargs="*", help="extra dagrl overrides")
    args = ap.parse_args()
    model = build(args.out, args.shape)
    run_dir = tempfile.mkdtemp(prefix="run_", dir=args.out)
    cmd, env = run_command(run_dir, lambda plugin: overrides(args, model, run_dir, plugin))
    plan = subprocess.run(cmd + ["trainer.dry_run=true"], env=env, capture_output=True, text=True, cwd=REPO)
    plan_lines = [ln for ln in plan.stdout.splitlines() if "GiB" in ln or "->" in ln]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=args.timeout)
        rc, tail = proc.returncode, (proc.stderr + proc.stdout).strip().splitlines()[-4:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, [f"timed out after {args.timeout}s"]
    rows = []
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(metrics):
        rows = [json.loads(ln) for ln in open(metrics) if ln.strip()]
    steps = [round(r["timing_s/step"], 2) for r in rows if "timing_s/step" in r]
    last = rows[-1] if rows else {}
    keys = ("timing_s/", "perf/", "rollout/device", "teacher/device", "actor/grad_norm", "actor/pg_loss")
    keys += ("weight_sync/bytes", "weight_sync/s", "rollout_corr/logprob_abs_diff")  # LoRA: adapter vs merged
    line = {
        "setup": args.setup,
        "shape": args.shape,
        "rc": rc,
        "wall_s": round(time.perf_counter() - start, 1),
        "step_s": steps,
        "median_step_s": sorted(steps[1:] or steps)[len(steps[1:] or steps) // 2] if steps else None,
        "last": {k: round(v, 3) for k, v in last.items() if k.startswith(keys) and isinstance(v, float)},
        "plan": plan_lines[-12:],
        "tail": tail if rc else [],
        "date": time.strftime("%Y-%m-%d"),
    }
    try:
        import torch

        line["device"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 (the figure is optional)
        pass
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
