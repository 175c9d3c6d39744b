"""Sampling-pipeline throughput on one GPU: vLLM sampler + an outcome reward model role, prompts/s.

Builds a random Qwen3-shaped policy (bench/grpo_gpu.py's builder) and a sequence-classification
reward model of the same shape (one label), then runs `python -m dagrl.main pipeline=sample` on
the built-in task's prompts with the vLLM sampler (`--n` samples per prompt, `--response_length`
tokens, ignore_eos so every sample is that long) and the RM on the same card (colocated: the
engine sleeps while the RM scores). Reports prompts/s and samples/s over the shards after the
first (warm-up) from output_dir/metrics.jsonl, with the sampler's tokens/s and the RM's seconds.

    python bench/sample_gpu.py --out /tmp/sample_bench         # Qwen3-0.6B's shape, random weights
    python bench/sample_gpu.py --out /tmp/sample_bench --no-rm # the sampler alone
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tools.random_qwen3 import add_shape_args, build_from_args  # noqa: E402


def build_reward_model(policy: str, out: str) -> str:
    from transformers import AutoModelForSequenceClassification

    path = os.path.join(out, "rm")
    torch.manual_seed(1)
    rm = AutoModelForSequenceClassification.from_pretrained(policy, num_labels=1, dtype=torch.bfloat16)
    rm.config.pad_token_id = 0
    rm.save_pretrained(path)
    for f in os.listdir(policy):
        if f.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(policy, f), path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/dagrl_sample_bench")
    add_shape_args(ap)
    ap.add_argument("--prompts", type=int, default=384)
    ap.add_argument("--shard", type=int, default=128)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--response_length", type=int, default=512)
    ap.add_argument("--no-rm", dest="rm", action="store_false")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    policy = build_from_args(args.out, args)
    out_dir = os.path.join(args.out, "samples")
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "dagrl.main", "pipeline=sample",
        f"actor_rollout_ref.model.path={policy}", "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
        "actor_rollout_ref.rollout.ignore_eos=true", f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_response_length={args.response_length}",
        f"sample.output_dir={out_dir}", f"sample.shard_size={args.shard}", f"sample.max_prompts={args.prompts}",
        "sample.filter=best_of_n", "trainer.device=cuda", "trainer.progress_bar=false",
    ]  # fmt: skip
    if args.rm:
        cmd += [
            f"sample.orm_model={build_reward_model(policy, args.out)}",
            "reward.model.micro_batch_size_per_gpu=64",
        ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        shards = [json.loads(line) for line in f]
    timed = shards[1:] or shards  # the first shard pays for CUDA graphs and the engine's warm-up
    seconds = sum(s["timing_s/step"] for s in timed)
    prompts = sum(s["prompts"] for s in timed)
    print(json.dumps({
        "prompts_per_s": round(prompts / seconds, 2),
        "samples_per_s": round(prompts * args.n / seconds, 1),
        "sampler_tokens_per_s": round(sum(s["rollout/tokens_per_s"] for s in timed) / len(timed)),
        "orm_s_per_shard": round(sum(s.get("timing_s/orm", 0.0) for s in timed) / len(timed), 3),
        "sampler_s_per_shard": round(sum(s["timing_s/sampler"] for s in timed) / len(timed), 3),
        "gpu": torch.cuda.get_device_name(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
