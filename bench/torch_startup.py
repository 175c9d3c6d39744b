"""Start-up of the torch backend's trained role with the optimizer step on the host
(actor.optimizer_cpu_offload), stage by stage: what a worker spends before it is ready.

Builds a random Qwen3-shape checkpoint (tools/random_qwen3.py; no download), then in a fresh
process per repeat does what TorchTrainBackend.__init__ does for a bf16 model, timing each stage:

    load     load_causal_lm: the HF model from its directory onto --device
    buffers  MasterWeightsAdamW up to its moments: the fp32 masters (copied from the weights), the
             host gradient and staging buffers (pinned where the weights are on a GPU)
    moments  MasterWeightsAdamW._create_moments: Adam's m and v, made before any forward

    python bench/torch_startup.py --layers 16 --device cpu --repeat 5   # ~0.4B, a CPU machine
    python bench/torch_startup.py --layers 36 --hidden 4096 --heads 32 --intermediate 12288

One JSON line per repeat (seconds; peak_rss_gib = the process's resident peak; on a GPU also
pinned_gib = what torch's pinned host allocator holds, its blocks rounded up to powers of two, and
pin_s = the time it spent pinning), then the median of each field.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def measure(path: str, device: str) -> dict:
    """One start-up in this process."""
    import torch
    import transformers  # noqa: F401  (imported before the clock: every worker has it already)

    from dagrl.backends.hf_model import load_causal_lm
    from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW
    from dagrl.config.schema import OptimConfig

    out: dict[str, float] = {}
    start = time.perf_counter()
    model = load_causal_lm(path, "bfloat16", torch.device(device))
    out["load"] = time.perf_counter() - start
    create_moments = MasterWeightsAdamW._create_moments

    def timed(self) -> None:
        begin = time.perf_counter()
        create_moments(self)
        out["moments"] = time.perf_counter() - begin

    MasterWeightsAdamW._create_moments = timed
    start = time.perf_counter()
    MasterWeightsAdamW(list(model.parameters()), OptimConfig(lr=1e-6), torch.device("cpu"))
    out["buffers"] = time.perf_counter() - start - out["moments"]
    out["total"] = out["load"] + out["buffers"] + out["moments"]
    out["params_b"] = sum(p.numel() for p in model.parameters()) / 1e9
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if device == "cuda":
        stats = torch.cuda.host_memory_stats()
        out["pinned_gib"] = stats["allocated_bytes.current"] / 2**30  # rounded blocks, as CUDA gave them
        out["pin_s"] = stats["host_alloc_time.total"] / 1e6  # microseconds in cudaHostAlloc
    return {k: round(v, 3) for k, v in out.items()}


HOST_SHARE = 0.9  # of the available host memory, at most, for the measured process


def host_need_gib(path: str) -> float:
    """What the child's host step holds: fp32 masters and Adam's m and v of every parameter, and the
    pinned gradient and staging buffers (dagrl/backends/torch/memory.py's count)."""
    from dagrl.backends.model_shape import read_model_shape
    from dagrl.backends.torch.memory import host_step_pinned_bytes

    shape = read_model_shape(path)
    return (12 * shape.params + host_step_pinned_bytes(shape, 2)) / 2**30


def available_gib() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def main() -> None:
    from tools.random_qwen3 import add_shape_args, build_from_args

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_args(p)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="/tmp/dagrl_torch_startup")
    p.add_argument("--model", default=None, help="an existing model directory (skips the build)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.device)), flush=True)
        return
    path = args.model or build_from_args(args.out, args)
    need, free = host_need_gib(path), available_gib()
    if need > HOST_SHARE * free:
        # the child would be killed mid-way (session 30: the 8B shape on a 125 GiB host, SIGKILL)
        print(f"host: the host step's state needs ~{need:.1f} GiB, this host has {free:.1f} GiB available"
              f" (at most {HOST_SHARE:.0%} of it taken): run it on a host with more memory, or a smaller --layers")  # fmt: skip
        sys.exit(2)
    rows = []
    for _ in range(args.repeat):
        cmd = [sys.executable, __file__, "--child", path, "--device", args.device]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        print(line, flush=True)
        rows.append(json.loads(line))
    print(json.dumps({"median": {k: statistics.median(r[k] for r in rows) for k in rows[0]}}))


if __name__ == "__main__":
    main()
