"""GRPO steps of a train backend (torch or megatron) + hf rollout on GPUs, with a model of real size.

Builds a randomly initialised model from a Qwen3-style config (no download), reuses the shipped
character tokenizer (the model's vocabulary is larger; the extra rows are simply unused), runs
`python -m dagrl.main` for a few steps and prints per-node seconds, tokens/s and peak memory.
Random weights earn no reward, so advantages are 0: this measures speed and memory, not learning.

    python bench/grpo_gpu.py --out /tmp/bench --hidden 1024 --layers 28 --steps 3
    python bench/grpo_gpu.py --strategy megatron --steps 3 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 trainer.n_gpus_per_node=2

MFU = model FLOP/s per GPU / --peak_tflops (989 = H100/H200 SXM dense bf16); the megatron backend
reports its FLOP/s (formula in dagrl/backends/megatron/train.py::_throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import torch


def build_model(out: str, hidden: int, layers: int, vocab: int) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from dagrl.data.builtin import tiny_model_path

    path = os.path.join(out, "model")
    heads = max(1, hidden // 128)
    cfg = AutoConfig.for_model(
        "qwen3",
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=128,
        vocab_size=vocab,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        architectures=["Qwen3ForCausalLM"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    for f in os.listdir(tiny_model_path()):
        if f.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(tiny_model_path(), f), path)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: {n / 1e6:.0f}M parameters, hidden {hidden}, {layers} layers, vocab {vocab}", flush=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/dagrl_bench")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--response_length", type=int, default=256)
    ap.add_argument("--strategy", choices=["torch", "megatron"], default="torch")
    ap.add_argument("--micro", type=int, default=16, help="ppo_micro_batch_size_per_gpu")
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("extra", nargs="*", help="more dagrl overrides")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = build_model(args.out, args.hidden, args.layers, args.vocab)
    run_dir = os.path.join(args.out, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "dagrl.main",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "trainer.device=cuda",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.default_local_dir={run_dir}",
        f"data.train_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_response_length={args.response_length}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.actor.strategy={args.strategy}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
        *args.extra,
    ]
    print("command:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    keys = [
        "timing_s/step",
        "timing_s/rollout",
        "timing_s/old_logprob",
        "timing_s/actor_update",
        "timing_s/weight_sync",
        "rollout/tokens_per_s",
        "response_length/mean",
        "weight_sync/GBps",
        "perf/device_memory_used_gib",
        "perf/offload_freed_gib",
        "perf/update_tokens_per_s",
        "perf/old_logprob_tokens_per_s",
    ]
    for r in rows:
        row = {"step": r["step"], **{k: round(r[k], 3) for k in keys if k in r}}
        for phase in ("update", "old_logprob"):
            if f"perf/{phase}_tflops_per_gpu" in r:
                row[f"mfu/{phase}"] = round(r[f"perf/{phase}_tflops_per_gpu"] / args.peak_tflops, 3)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
