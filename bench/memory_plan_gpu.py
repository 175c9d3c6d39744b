"""The memory plan against real peaks on one GPU: estimate vs measured per phase, as JSON lines.

Each configuration runs in its own process (a fresh CUDA context and vLLM engine): the plan is
made as the dry run makes it (dagrl.trainer.setup.prepare), then the colocated roles are built on
one in-process Worker in start-up order (engine first) and one GRPO step is driven phase by phase
(rollout, old log-probs, teacher, update, weight sync, then a second rollout and update, so Adam's
state exists). Measured per phase = device memory in use when the phase starts
(total - free from torch.cuda.mem_get_info: CUDA context, vLLM's pool, every role's resident
state) + the allocator's peak above what was allocated at that moment. Random-weight Qwen3 shapes
(tools/random_qwen3.py), the shipped tokenizer, responses forced to full length (ignore_eos).

    python bench/memory_plan_gpu.py                      # the six configurations, ~6-8 min on an H100
    python bench/memory_plan_gpu.py --only 0.6b-torch 0.6b-default
    python bench/memory_plan_gpu.py --prompts 16 --n 8 --response 512 key=value ...  (extra overrides)

Acceptance (issue 20): |measured / estimate - 1| <= 0.15 for every phase of six configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {  # hidden, layers, heads, kv heads, intermediate (Qwen3 shapes, vocabulary 151,936)
    "0.6b": (1024, 28, 16, 8, 3072),
    "1.7b": (2048, 28, 16, 8, 6144),
}
A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
BF16 = (f"{M}.dtype=bfloat16",)
MEGATRON = (f"{A}.strategy=megatron",)
MICRO16 = (f"{A}.ppo_micro_batch_size_per_gpu=16",)  # activations kept: no recomputation needed
RECOMPUTE = tuple(  # megatron's full recompute, one layer per unit
    f"{A}.megatron.{k}"
    for k in ("recompute_granularity=full", "recompute_method=uniform", "recompute_num_layers=1")
)


def teacher(models: dict) -> tuple[str, ...]:
    return (f"teacher.model={models['1.7b']}", "algorithm.distill_reward.coef=0.1")


CONFIGS = {  # name -> (student shape, overrides(models))
    "0.6b-torch": ("0.6b", lambda m: BF16 + MICRO16),  # the plan leaves recomputation off
    "0.6b-megatron": ("0.6b", lambda m: BF16 + MEGATRON + MICRO16),
    "1.7b-torch": ("1.7b", lambda m: BF16),  # micro-batch 64: the plan turns recomputation on
    "1.7b-megatron": ("1.7b", lambda m: BF16 + MEGATRON + RECOMPUTE),
    "0.6b-torch-teacher": ("0.6b", lambda m: BF16 + teacher(m)),
    "0.6b-megatron-teacher": ("0.6b", lambda m: BF16 + MEGATRON + RECOMPUTE + teacher(m)),
    # the default run: fp32, 64 prompts x 8 x 512 (use with --prompts 64)
    "0.6b-default": ("0.6b", lambda m: ()),
}
SIX = [name for name in CONFIGS if name != "0.6b-default"]


def build_models(out: str, needed: set[str]) -> dict[str, str]:
    sys.path.insert(0, REPO)
    from tools.random_qwen3 import build_random_qwen3

    paths = {}
    for shape in sorted(needed):
        path = os.path.join(out, f"qwen3-{shape}")
        if not os.path.isfile(os.path.join(path, "config.json")):
            hidden, layers, heads, kv, inter = SHAPES[shape]
            build_random_qwen3(path, hidden, layers, heads, kv, inter, 151936, head_dim=128)
        paths[shape] = path
    return paths


def overrides_for(name: str, models: dict, args) -> list[str]:
    shape, extra = CONFIGS[name]
    return [
        f"{M}.path={models[shape]}",
        f"{A}.optim.lr=1e-6",
        f"{R}.name=vllm",
        f"{R}.ignore_eos=true",  # full-length responses: the largest activations and logits
        f"{A}.recompute_old_logprobs=true",  # measure the old-log-prob phase (auto skips it on-policy)
        f"{R}.enforce_eager=true",  # faster start; the pool is gpu_memory_utilization x card either way
        "trainer.device=cuda",
        f"data.train_batch_size={args.prompts}",
        f"{A}.ppo_mini_batch_size={args.prompts}",
        f"{R}.n={args.n}",
        f"data.max_prompt_length={args.prompt}",
        f"data.max_response_length={args.response}",
        *extra(models),
        *args.overrides,
    ]


# ---- one configuration (child process) ------------------------------------------------------------


class _Poller:
    """Device memory in use (total - free), sampled every 2 ms on a thread: the card's real peak."""

    def __init__(self):
        import threading

        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import torch

        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            self._stop.wait(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(worker, role: str, fn):
    """(result, GiB at the phase's peak, the parts of that figure) of fn(backend) after the role
    takes the device. The figure: what is in use outside torch's allocator at the phase start (CUDA
    context, an engine's pool) + the allocator's peak of allocated bytes in the phase, i.e. the
    device's peak were the allocator to cache nothing (what the plan models). Also reported: the
    same with the allocator's reserved peak (its cache and fragmentation counted) and the sampled
    peak of total - free."""
    import torch

    backend = worker.activate(role)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved0, allocated0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with _Poller() as poll:
        result = fn(backend)
        torch.cuda.synchronize()
    outside = (total - free) - reserved0
    gib = 2**-30
    parts = {
        "used_start": (total - free) * gib,
        "outside_allocator": outside * gib,
        "allocated_start": allocated0 * gib,
        "cached_start": (reserved0 - allocated0) * gib,
        "peak_allocated": torch.cuda.max_memory_allocated() * gib,
        "with_reserved": (outside + torch.cuda.max_memory_reserved()) * gib,
        "sampled": poll.peak * gib,
        "session7_formula": ((total - free) + max(0, torch.cuda.max_memory_allocated() - allocated0)) * gib,
    }
    measured = (outside + torch.cuda.max_memory_allocated()) * gib
    return result, measured, {k: round(v, 2) for k, v in parts.items()}


def run_child(name: str, args) -> None:
    import torch
    from omegaconf import OmegaConf

    from dagrl.backends import build_backend
    from dagrl.backends.registry import startup_order
    from dagrl.backends.weight_sync import _copy_local
    from dagrl.core.batch import Batch
    from dagrl.core.worker import Worker
    from dagrl.main import compose
    from dagrl.trainer.memory_plan import GIB
    from dagrl.trainer.setup import prepare, worker_parts

    models = json.loads(args.models)
    cfg = OmegaConf.to_object(compose(overrides_for(name, models, args) + ["trainer.dry_run=true"]))
    prepared = prepare(cfg)  # the plan as a dry run makes it, on this card; auto defaults resolved
    prepared.cfg.trainer.dry_run = False
    [group] = prepared.memory.groups
    estimate = {row.phase: row.total / GIB for row in group.rows}
    roles = group.roles
    order = startup_order(prepared.plan.specs[r] for r in roles)
    parts = worker_parts(prepared.cfg, {r: prepared.plan.specs[r] for r in order})
    worker = Worker(parts, order, 0, 1, "cuda", threads=4, build=build_backend)
    start = time.perf_counter()
    worker.setup("127.0.0.1", 0)
    free, total = torch.cuda.mem_get_info()
    emit(name, "startup", None, (total - free) / 2**30, {"order": order, "s": time.perf_counter() - start})

    rows, gen = args.prompts * args.n, torch.Generator().manual_seed(0)
    prompts = torch.randint(2, 250, (args.prompts, args.prompt), generator=gen).repeat_interleave(args.n, 0)
    base = Batch({"prompts": prompts, "prompt_mask": torch.ones_like(prompts)})
    inputs = ("prompts", "prompt_mask", "responses", "response_mask")
    measured: dict[str, float] = {}
    for step in range(2):
        if step:
            _, gib, parts = measure(worker, "train", lambda b: _copy_local(worker, "train", "rollout"))
            keep(measured, "weight_sync", gib, parts)
        out, gib, parts = measure(worker, "rollout", lambda b, s=step: b.generate(base, seed=s)[0])
        keep(measured, "rollout", gib, parts)
        batch = base.union(out)
        view = batch.select(inputs)
        old, gib, parts = measure(worker, "train", lambda b, v=view: b.forward_logprobs(v, "old_logprobs")[0])
        keep(measured, "old_logprob", gib, parts)
        if "teacher" in roles:
            _, gib, parts = measure(
                worker, "teacher", lambda b, v=view: b.forward_logprobs(v, "teacher_logprobs")
            )
            keep(measured, "teacher", gib, parts)
        advantages = torch.randn(rows, 1, generator=gen) * batch["response_mask"]
        update = batch.union(old).union(Batch({"advantages": advantages}))
        _, gib, parts = measure(worker, "train", lambda b, u=update: b.train_step(u))
        keep(measured, "update", gib, parts)
    rows = {row.phase: row for row in group.rows}
    for phase, (gib, parts) in measured.items():
        row = rows.get(phase)
        plan = (
            {}
            if row is None
            else {
                "plan_parts": {k: round(v / GIB, 2) for k, v in row.parts.items()},
                "plan_others": {k: round(v / GIB, 2) for k, v in row.others.items()},
            }
        )
        emit(
            name,
            phase,
            estimate.get(phase),
            gib,
            {"measured_parts": parts, **plan, "notes": prepared.memory.notes},
        )
    worker.shutdown()


def keep(measured: dict, phase: str, gib: float, parts: dict) -> None:
    """The larger of a phase's two steps (the second has Adam's state)."""
    if gib >= measured.get(phase, (0.0, None))[0]:
        measured[phase] = (gib, parts)


def emit(name: str, phase: str, estimate: float | None, measured: float, extra: dict) -> None:
    import torch

    line = {"config": name, "phase": phase, "measured_gib": round(measured, 2)}
    if estimate is not None:
        line.update(estimate_gib=round(estimate, 2), error_pct=round(100 * (measured / estimate - 1), 1))
    line.update(device=torch.cuda.get_device_name(0), date=time.strftime("%Y-%m-%d"), **extra)
    print(json.dumps(line), flush=True)


# ---- driver ---------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/dagrl_memory_plan")
    ap.add_argument("--only", nargs="*", default=SIX, choices=sorted(CONFIGS))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=512)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per configuration")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--models", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="extra dagrl overrides for every configuration")
    args = ap.parse_args()
    if args.child:
        run_child(args.child, args)
        return
    needed = {CONFIGS[n][0] for n in args.only} | (
        {"1.7b"} if any("teacher" in n for n in args.only) else set()
    )
    models = build_models(args.out, needed)
    worst: dict[str, float] = {}
    for name in args.only:
        cmd = [sys.executable, __file__, "--child", name, "--models", json.dumps(models)]
        cmd += [f"--{k}={getattr(args, k)}" for k in ("prompts", "n", "prompt", "response")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        try:
            proc = subprocess.run(
                cmd + args.overrides, env=env, capture_output=True, text=True, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            print(json.dumps({"config": name, "error": f"timed out after {args.timeout}s"}), flush=True)
            continue
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        for ln in lines:
            print(ln, flush=True)
            row = json.loads(ln)
            if "error_pct" in row:
                worst[name] = max(worst.get(name, 0.0), abs(row["error_pct"]))
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            print(json.dumps({"config": name, "error": " | ".join(tail)}), flush=True)
    print(
        json.dumps({"summary": "worst |error| % per configuration (acceptance <= 15)", **worst}), flush=True
    )


if __name__ == "__main__":
    main()
