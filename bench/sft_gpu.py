"""SFT tokens/s on one GPU: dagrl's `algorithm=sft` (torch backend) against a plain PyTorch loop
(the same model, AdamW, bf16, the same batches, no Ray, no DAG) on the same card.

Builds a randomly initialised Qwen3-shaped model (bench/grpo_gpu.py's builder, shipped character
tokenizer), writes a parquet of `--rows` rows whose `response` holds `--response_length`
characters (one token each), then times both. Tokens = prompt + response tokens of every row
trained, padding excluded; the first `--warmup` steps are not timed.

    python bench/sft_gpu.py --out /tmp/sft_bench              # Qwen3-0.6B's shape, random weights
    python bench/sft_gpu.py --out /tmp/sft_bench --packing    # use_remove_padding=true

Prints one JSON line: dagrl's tokens/s, a plain loop's in pure bf16 and with fp32 weights under
bf16 autocast (dagrl keeps fp32 master weights), and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tools.random_qwen3 import add_shape_args, build_from_args  # noqa: E402


def write_rows(path: str, rows: int, response_length: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    table = [
        {
            "data_source": "dagrl/arith",
            "prompt": [{"role": "user", "content": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="}],
            "ability": "arith",
            "reward_model": {"style": "rule", "ground_truth": "0"},
            "extra_info": {"index": i},
            "response": "".join(rng.choice(letters) for _ in range(response_length - 1)),
        }
        for i in range(rows)
    ]
    pq.write_table(pa.Table.from_pylist(table), path)


def dagrl_tokens_per_s(args, model: str, data: str) -> float:
    run_dir = os.path.join(args.out, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "dagrl.main", "algorithm=sft",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.offload=false",
        f"actor_rollout_ref.model.use_remove_padding={str(args.packing).lower()}",
        f"data.train_files={data}", f"data.train_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"data.max_response_length={args.response_length}", "data.max_prompt_length=32",
        "trainer.device=cuda", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.progress_bar=false",
        f"trainer.default_local_dir={run_dir}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][args.warmup :]
    tokens = args.batch * (args.response_length + 9)  # ~9 prompt tokens under the chat template
    seconds = sum(r["timing_s/actor_update"] for r in rows)
    return tokens * len(rows) / seconds


def plain_tokens_per_s(args, model_path: str, autocast: bool) -> float:
    """The loop every SFT trainer reduces to: forward, NLL on the response, backward, AdamW.
    autocast=False: bf16 weights and AdamW state (the fastest, least accurate); True: fp32 weights
    and AdamW state with bf16 autocast, the usual plain-PyTorch counterpart of dagrl's fp32 masters."""
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if autocast else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).cuda()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    seq = args.response_length + 9
    ids = torch.randint(2, 200, (args.batch, seq), device="cuda")
    labels = ids.clone()
    labels[:, :9] = -100  # the loss on the response only
    seconds = 0.0
    for step in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        for i in range(0, args.batch, args.micro):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                out = model(input_ids=ids[i : i + args.micro], labels=labels[i : i + args.micro])
            (out.loss * args.micro / args.batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            seconds += time.perf_counter() - start
    del model, optim
    torch.cuda.empty_cache()
    return args.batch * seq * (args.steps - args.warmup) / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/dagrl_sft_bench")
    add_shape_args(ap)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--response_length", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--packing", action="store_true", help="use_remove_padding=true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = build_from_args(args.out, args)
    data = os.path.join(args.out, "sft.parquet")
    write_rows(data, args.rows, args.response_length)
    ours = dagrl_tokens_per_s(args, model, data)
    plain = plain_tokens_per_s(args, model, autocast=False)
    mixed = plain_tokens_per_s(args, model, autocast=True)
    print(json.dumps({"dagrl_sft_tokens_per_s": round(ours), "plain_bf16_tokens_per_s": round(plain),
                      "plain_autocast_tokens_per_s": round(mixed), "ratio_vs_bf16": round(ours / plain, 3),
                      "ratio_vs_autocast": round(ours / mixed, 3), "packing": args.packing,
                      "gpu": torch.cuda.get_device_name()}))  # fmt: skip


if __name__ == "__main__":
    main()
