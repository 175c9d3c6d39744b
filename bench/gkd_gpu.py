"""GKD steps with a colocated, offloaded teacher at real sizes: top-k 64 and the full vocabulary.

Student of the Qwen3-0.6B shape (hidden 1024, 28 layers, 16 heads, 8 KV heads, intermediate 3072),
teacher of the Qwen3-1.7B shape (hidden 2048, 28 layers, 16 heads, 8 KV heads, intermediate 6144),
both with Qwen3's 151,936-word vocabulary, random bf16 weights built from the config into --out (no
download; the shipped character tokenizer is reused, the extra vocabulary rows are simply unused).
Runs `python -m dagrl.main algorithm=gkd` per mode and prints per step: step / rollout / teacher /
update seconds, the teacher's own seconds, peak memory per phase and the GiB the teacher's offload
freed. Random weights teach nothing: this measures time and memory, not learning.

Memory per phase (dagrl/backends/device_memory.py): `teacher/device_memory_used_gib` is the card's
used memory (total - free) at the teacher phase's end; `perf/device_memory_used_gib`, read after the
update, is the largest such sample of the step (rollout, log-prob, teacher and update ends);
`*/peak_added_gib` is what each phase's own tensors added at its peak. (Before these, the allocator's
`max_memory_allocated` was reported, which counts a sleeping vLLM pool and can exceed the card.)

On one 80 GB card (results of the first two on 1× H100: docs/perf.md):

    python bench/gkd_gpu.py --out /tmp/gkd_bench --strategy megatron --rollout vllm
    python bench/gkd_gpu.py --out /tmp/gkd_bench --strategy torch --rollout vllm
    python bench/gkd_gpu.py --out /tmp/gkd_bench --strategy megatron --rollout hf --modes full

Each micro-batch is one sequence of --response_length (default 4096) response tokens (the rollout
ignores EOS under vLLM; random weights hardly ever sample it under hf), so the full-vocabulary mode
runs 151,936 words × 4,096 response tokens per micro-batch.

CPU smoke test (tiny shapes, hf rollout, torch backend, both modes, one step each; ~1 min):

    python bench/gkd_gpu.py --device cpu --out /tmp/gkd_smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

STUDENT = dict(hidden=1024, layers=28, heads=16, kv_heads=8, intermediate=3072)
TEACHER = dict(hidden=2048, layers=28, heads=16, kv_heads=8, intermediate=6144)
TINY_STUDENT = dict(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
TINY_TEACHER = dict(hidden=48, layers=2, heads=2, kv_heads=1, intermediate=96)
MODES = {"topk": ["algorithm.gkd.gkd_logits_topk=64", "algorithm.gkd.tail_bucket=true"], "full": []}
KEYS = (
    "timing_s/step",
    "timing_s/rollout",
    "timing_s/teacher_logprob",
    "timing_s/teacher_hidden",
    "timing_s/actor_update",
    "timing_s/teacher_forward",
    "teacher/device_memory_used_gib",
    "teacher/peak_added_gib",
    "teacher/offload_freed_gib",
    "perf/device_memory_used_gib",
    "perf/peak_added_gib",
    "perf/offload_freed_gib",
    "response_length/mean",
    "distill/divergence",
)


def build_model(path: str, shape: dict, vocab: int, max_len: int, dtype: torch.dtype) -> str:
    """A randomly initialised Qwen3 model of `shape`, saved with the shipped tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dagrl.data.builtin import tiny_model_path

    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    cfg = AutoConfig.for_model(
        "qwen3",
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=max(16, shape["hidden"] // shape["heads"]) if shape["hidden"] < 1024 else 128,
        vocab_size=vocab,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        architectures=["Qwen3ForCausalLM"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(path)
    for f in os.listdir(tiny_model_path()):
        if f.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(tiny_model_path(), f), path)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{path}: {n / 1e6:.0f}M parameters, hidden {shape['hidden']}, {shape['layers']} layers", flush=True
    )
    return path


def run_mode(args, mode: str, student: str, teacher: str) -> list[dict]:
    run_dir = os.path.join(args.out, f"run_{args.strategy}_{args.rollout}_{mode}")
    shutil.rmtree(run_dir, ignore_errors=True)
    gpu = args.device == "cuda"
    cmd = [
        sys.executable, "-m", "dagrl.main", "algorithm=gkd", *MODES[mode],
        f"actor_rollout_ref.model.path={student}",
        f"teacher.model={teacher}",
        "teacher.offload=true",
        f"teacher.log_prob_micro_batch_size_per_gpu={args.teacher_micro}",
        f"actor_rollout_ref.model.dtype={'bfloat16' if gpu else 'float32'}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.strategy={args.strategy}",
        f"actor_rollout_ref.actor.offload={'true' if gpu else 'false'}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.rollout.name={args.rollout}",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"data.train_batch_size={args.batch}",
        f"data.max_response_length={args.response_length}",
        f"trainer.device={args.device}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
    ]  # fmt: skip
    if args.rollout == "vllm":
        cmd += [
            "actor_rollout_ref.rollout.ignore_eos=true",
            "actor_rollout_ref.rollout.free_cache_engine=true",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        ]
    if args.strategy == "megatron" and not gpu:
        plugin = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "plugins")
        cmd += [
            f"external_plugins=[{plugin}/megatron_cpu.py]",
            "actor_rollout_ref.actor.megatron.param_dtype=float32",
        ]
    cmd += args.extra
    print(f"== {mode}: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    out = []
    for r in rows:
        row = {"mode": mode, "step": r["step"], **{k: round(r[k], 3) for k in KEYS if k in r}}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/gkd_bench")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--strategy",
        choices=["torch", "megatron"],
        default=None,
        help="default: megatron on cuda, torch on cpu",
    )
    ap.add_argument(
        "--rollout", choices=["vllm", "hf"], default=None, help="default: vllm on cuda, hf on cpu"
    )
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--steps", type=int, default=None, help="default: 3 on cuda, 1 on cpu")
    ap.add_argument("--batch", type=int, default=None, help="prompts per step (default 4 on cuda, 2 on cpu)")
    ap.add_argument("--n", type=int, default=2, help="responses per prompt")
    ap.add_argument("--response_length", type=int, default=None, help="default 4096 on cuda, 8 on cpu")
    ap.add_argument("--micro", type=int, default=1, help="sequences per student micro-batch")
    ap.add_argument("--teacher_micro", type=int, default=1, help="sequences per teacher micro-batch")
    ap.add_argument("--gpu_memory_utilization", type=float, default=0.35)
    ap.add_argument("extra", nargs="*", help="more dagrl overrides")
    args = ap.parse_args()
    gpu = args.device == "cuda"
    args.rollout = args.rollout or ("vllm" if gpu else "hf")
    args.steps = args.steps or (3 if gpu else 1)
    args.batch = args.batch or (4 if gpu else 2)
    args.response_length = args.response_length or (4096 if gpu else 8)
    args.strategy = args.strategy or ("megatron" if gpu else "torch")
    os.makedirs(args.out, exist_ok=True)
    vocab = 151936 if gpu else 6000  # the CPU smoke still crosses the old 4,096-word full-vocab limit
    max_len = args.response_length + 128
    dtype = torch.bfloat16 if gpu else torch.float32
    tag = "" if gpu else "_tiny"
    student = build_model(
        os.path.join(args.out, f"student{tag}"), STUDENT if gpu else TINY_STUDENT, vocab, max_len, dtype
    )
    teacher = build_model(
        os.path.join(args.out, f"teacher{tag}"), TEACHER if gpu else TINY_TEACHER, vocab, max_len, dtype
    )
    rows = [row for mode in args.modes for row in run_mode(args, mode, student, teacher)]
    print("GKD_BENCH " + json.dumps(rows), flush=True)


if __name__ == "__main__":
    main()
