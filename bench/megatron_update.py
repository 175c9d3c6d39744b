"""The megatron backend's actor update alone, at a GRPO shape, without Ray or a rollout.

Builds `MegatronTrainBackend` in this process (or one per torchrun rank) on a randomly
initialised Qwen3-architecture checkpoint (bench/grpo_gpu.py's builder), makes a synthetic GRPO
batch (left-padded prompts of 16..--prompt-len tokens, full --response-len responses, random
advantages and old log-probs) and times `forward_logprobs` and `train_step` as the trainer calls
them. With --offload, every step is preceded by offload() + onload() like a colocated run.
Pair it with bench/mcore_loop.py at the same shape (same call) to get the ratio that docs/perf.md
reports; --profile writes a kernel table of one update.

    python bench/megatron_update.py --out /tmp/mu --steps 5 --offload
    torchrun --nproc-per-node 2 bench/megatron_update.py --tp 2 --sp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

import mcore_loop  # noqa: E402  (bench/ is on the path from here)

M = "actor_rollout_ref.actor.megatron"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/megatron_update")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rows", type=int, default=256, help="responses per step (prompts x n)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--response-len", type=int, default=256)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--sp", action="store_true")
    p.add_argument("--offload", action="store_true", help="offload + onload before every step")
    p.add_argument("--entropy-coeff", type=float, default=0.0)
    p.add_argument("--profile", help="profile one update; kernel table to this file")
    p.add_argument(
        "--with-loop",
        action="store_true",
        help="also build bench/mcore_loop.py's model at this shape in this process and time one of its "
        "steps before every update: a paired ratio under the same host conditions",
    )
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test (test patch)")
    p.add_argument("extra", nargs="*", help="more dagrl overrides")
    return p.parse_args()


def synthetic_batch(args, vocab: int):
    from dagrl.core.batch import Batch

    g = torch.Generator().manual_seed(0)
    rows, plen, rlen = args.rows, args.prompt_len, args.response_len
    prompt_lens = torch.randint(min(16, plen), plen + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(plen)[None] >= plen - prompt_lens[:, None]).long()
    return Batch(
        {
            "prompts": torch.randint(2, vocab, (rows, plen), generator=g) * prompt_mask,
            "prompt_mask": prompt_mask,
            "responses": torch.randint(2, vocab, (rows, rlen), generator=g),
            "response_mask": torch.ones(rows, rlen, dtype=torch.long),
            "advantages": torch.randn(rows, rlen, generator=g),
        }
    )


def plain_loop(args, dp_size: int) -> tuple:
    """bench/mcore_loop.py's model, optimizer and batch at this GRPO shape, in this process's megatron
    parallel state: (args, model, optimizer, batch) for mcore_loop.train_step."""
    heads = max(1, args.hidden // 128)
    loop_args = mcore_loop.parse_args(
        [
            *("--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab)),
            *("--heads", str(heads), "--query-groups", str(max(1, heads // 2)), "--head-dim", "128"),
            *("--ffn", str(3 * args.hidden), "--tie-embeddings", "--spec", "sdpa", "--device", args.device),
            *("--seq-len", str(args.prompt_len + args.response_len), "--micro-batch", str(args.micro)),
            *("--num-micro-batches", str(args.rows // dp_size // args.micro)),
            *("--tp", str(args.tp), "--pp", str(args.pp), *(["--sp"] if args.sp else [])),
            *("--dtype", "bf16" if args.device == "cuda" else "fp32"),
        ]
    )
    config = mcore_loop.build_config(loop_args)
    model = mcore_loop.build_model(loop_args, config)
    optimizer = mcore_loop.build_optimizer(loop_args, config, model)
    return loop_args, model, optimizer, mcore_loop.synthetic_batch(loop_args)


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    cuda = args.device == "cuda"
    if not cuda:
        from tests import megatron_cpu_patch

        megatron_cpu_patch.apply()
    if world > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
    elif cuda:
        torch.cuda.set_device(0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model_dir = os.path.join(args.out, "model")
    if rank == 0 and not os.path.isdir(model_dir):
        from grpo_gpu import build_model

        os.makedirs(args.out, exist_ok=True)
        build_model(args.out, args.hidden, args.layers, args.vocab)
    if world > 1:
        torch.distributed.barrier()

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.config.validate import resolve_defaults, validate
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext
    from dagrl.main import CONF_DIR

    n = 8
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"trainer.device={args.device}",
        f"trainer.n_gpus_per_node={world}",
        f"actor_rollout_ref.rollout.n={n}",
        f"data.train_batch_size={args.rows // n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.rows // n}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        f"actor_rollout_ref.actor.entropy_coeff={args.entropy_coeff}",
        f"{M}.tensor_model_parallel_size={args.tp}",
        f"{M}.pipeline_model_parallel_size={args.pp}",
        f"{M}.sequence_parallel={args.sp}",
        *(f"{M}.{k}_offload={args.offload}" for k in ("param", "grad", "optimizer")),
        *args.extra,
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    resolve_defaults(cfg)
    validate(cfg)
    backend = MegatronTrainBackend.from_config(
        cfg,
        ParallelContext(
            rank, world, torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        ),
    )
    dp_rank, dp_size, _ = backend.dp_info()
    batch = synthetic_batch(args, backend.hf_config.vocab_size).split(dp_size)[dp_rank]
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    loop = plain_loop(args, dp_size) if args.with_loop else None
    rows = []
    for step in range(args.steps + bool(args.profile)):
        if args.offload:
            backend.offload()
            backend.onload()
        sync()
        out, lp_metrics = backend.forward_logprobs(batch.select(keys), "old_logprobs")
        lp = out["old_logprobs"] if "old_logprobs" in out else torch.empty(len(batch), args.response_len)
        if world > 1:  # every rank needs the log-probs: the last stage's TP rank 0 has them
            lp = lp.float().cuda()
            torch.distributed.broadcast(lp, src=world - 1 if args.pp > 1 else 0)
        step_batch = batch.union(Batch({"old_logprobs": lp.float().cpu()}))
        sync()
        if args.profile and step == args.steps:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _, metrics = backend.train_step(step_batch)
                sync()
            if rank == 0:
                table = prof.key_averages().table(
                    sort_by="cuda_time_total", row_limit=50, max_name_column_width=90
                )
                with open(args.profile, "w") as f:
                    f.write(table)
                    f.write(f"\nwall of the profiled update: {metrics['perf/update_s']:.3f} s\n")
            break
        loop_s = mcore_loop.train_step(*loop) if loop else None
        start = time.perf_counter()
        _, metrics = backend.train_step(step_batch)
        sync()
        metrics["wall_s"] = time.perf_counter() - start
        if loop:
            loop_args = loop[0]
            loop_tokens = loop_args.micro_batch * loop_args.num_micro_batches * loop_args.seq_len
            metrics["loop_tokens_per_s"] = loop_tokens / loop_s
            metrics["ratio"] = metrics["perf/update_tokens_per_s"] / metrics["loop_tokens_per_s"]
        metrics.update(lp_metrics)
        rows.append(metrics)
        if rank == 0:
            keep = (
                "wall_s",
                "perf/update_s",
                "perf/update_tokens_per_s",
                "perf/update_tflops_per_gpu",
                "perf/logprob_s",
                "perf/logprob_tokens_per_s",
                "perf/device_memory_used_gib",
                "loop_tokens_per_s",
                "ratio",
            )
            print(
                json.dumps({"step": step, **{k: round(metrics[k], 3) for k in keep if k in metrics}}),
                flush=True,
            )
    if rank == 0 and rows:
        steady = rows[args.warmup :] or rows
        tps = statistics.median(r["perf/update_tokens_per_s"] for r in steady) * dp_size
        tflops = statistics.median(r["perf/update_tflops_per_gpu"] for r in steady)
        print(
            json.dumps(
                {
                    "summary": "update",
                    "tp": args.tp,
                    "pp": args.pp,
                    "sp": args.sp,
                    "dp": dp_size,
                    "offload": args.offload,
                    "tokens_per_s": round(tps),
                    "mfu": round(tflops / args.peak_tflops, 4),
                    "update_s": round(statistics.median(r["perf/update_s"] for r in steady), 3),
                    **(
                        {
                            "loop_tokens_per_s": round(
                                statistics.median(r["loop_tokens_per_s"] for r in steady) * dp_size
                            ),
                            "ratio_median": round(statistics.median(r["ratio"] for r in steady), 3),
                            "ratios": [round(r["ratio"], 3) for r in steady],
                        }
                        if loop
                        else {}
                    ),
                    "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else 0.0,
                    "device": torch.cuda.get_device_name() if cuda else "cpu",
                }
            ),
            flush=True,
        )
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
