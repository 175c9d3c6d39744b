"""A raw NCCL broadcast between two cards: the ceiling for separate placement's weight sync.

Rank 0 (cuda:0) broadcasts BYTES to rank 1 (cuda:1) in buckets of BUCKET_MB, as the weight sync
moves a model's weights (dagrl/backends/weight_broadcast.py), and the same bytes as one tensor.
No model, no export, no engine load: what is left of the sync's seconds is NCCL's. Prints one
`NCCL {...}` line: GB/s bucketed and whole, median of --reps after one warm-up.

    python bench/nccl_broadcast.py --bytes 1192099840 --bucket-mb 256
    python bench/nccl_broadcast.py --bytes 4000000 --backend gloo     # the script itself, on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed_broadcast(buffers: list[torch.Tensor], reps: int) -> float:
    """Median seconds to broadcast every buffer from rank 0 (after one warm-up round)."""
    sync = torch.cuda.synchronize if buffers[0].is_cuda else (lambda: None)
    seconds = []
    for rep in range(reps + 1):
        dist.barrier()
        sync()
        start = time.perf_counter()
        for buf in buffers:
            dist.broadcast(buf, src=0)
        sync()
        if rep:
            seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


def worker(rank: int, args, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = "cpu" if args.backend == "gloo" else f"cuda:{rank}"
    if device != "cpu":
        torch.cuda.set_device(rank)
    dist.init_process_group(args.backend, rank=rank, world_size=2)
    bucket = args.bucket_mb * 2**20
    sizes = [min(bucket, args.bytes - start) for start in range(0, args.bytes, bucket)]
    buckets = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
    bucketed = timed_broadcast(buckets, args.reps)
    del buckets
    whole = timed_broadcast([torch.empty(args.bytes, dtype=torch.uint8, device=device)], args.reps)
    if rank == 0:
        out.update(bucketed_GBps=args.bytes / bucketed / 1e9, whole_GBps=args.bytes / whole / 1e9)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, required=True, help="what one weight sync moves (weight_sync/bytes)")
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    args = ap.parse_args()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(args, args.port, out), nprocs=2)
        result = {k: round(v, 2) for k, v in out.items()}
    device = torch.cuda.get_device_name(0) if args.backend == "nccl" else "cpu"
    result.update(bytes=args.bytes, bucket_mb=args.bucket_mb, backend=args.backend, device=device)
    print("NCCL " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
