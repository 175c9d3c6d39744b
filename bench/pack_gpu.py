"""The separate sync's pack on the sender, alone on one device: pack_into (per-piece slicing each
sync) against PackViews (the recipe made once per plan), bucket by bucket as send_direct packs,
for the Qwen3 shapes of bench/weight_broadcast_gpu.py. Per case the median over --reps syncs of
the host loop (ms) and of the device time from the first pack's start to the last one's end (ms,
CUDA events; on the CPU the host's); every bucket packed both ways is compared byte for byte (rc 1
if any differs). No broadcast: the host loop is what keeps the two-buffer pipeline behind the wire on a
small model (its host loop ~ its span in session 32's 0.6B rows).

    python bench/pack_gpu.py                       # a GPU: 0.6b and 8b
    python bench/pack_gpu.py --cpu --shapes tiny   # the CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weight_broadcast_gpu import engine_slots, hf_tensors  # noqa: E402

from dagrl.backends.weight_layout import PackViews, bucket_bytes, pack_into, plan_buckets  # noqa: E402


def run(plan, srcs, buffer, pack, device, reps) -> tuple[float, float]:
    host, dev = [], []
    for _ in range(reps + 1):  # the first is the warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        t = time.perf_counter()
        for i, bucket in enumerate(plan):
            pack(i, bucket, srcs, buffer[: bucket_bytes(bucket)])
        host.append((time.perf_counter() - t) * 1e3)
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize()
            dev.append(begin.elapsed_time(end))
        else:
            dev.append(host[-1])
    return statistics.median(host[1:]), statistics.median(dev[1:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["0.6b", "8b"])
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    device = torch.device("cpu" if args.cpu else "cuda")
    rc = 0
    for shape in args.shapes:
        slots = engine_slots(shape)
        plan = plan_buckets(slots, args.bucket_mb * 2**20)
        srcs = hf_tensors(slots, device)  # the trainer's HF tensors, random
        size = max(bucket_bytes(b) for b in plan)
        views = PackViews(plan)
        cases = {
            "pack_into": lambda i, b, s, buf: pack_into(b, s, buf),
            "recipe": lambda i, b, s, buf, views=views: views.pack(i, s, buf),
        }
        for case, pack in cases.items():
            buffer = torch.zeros(size, dtype=torch.uint8, device=device)
            host_ms, dev_ms = run(plan, srcs, buffer, pack, device, args.reps)
            nbytes = sum(bucket_bytes(b) for b in plan)
            print(
                json.dumps(
                    {
                        "shape": shape,
                        "case": case,
                        "buckets": len(plan),
                        "pieces": sum(len(s.pieces) for b in plan for s, _ in b),
                        "bytes": nbytes,
                        "host_ms": round(host_ms, 3),
                        "device_ms": round(dev_ms, 3),
                        "device_GBps": round(nbytes / max(dev_ms, 1e-9) / 1e6, 1),
                        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    }
                ),
                flush=True,
            )
        a, b = (torch.zeros(size, dtype=torch.uint8, device=device) for _ in range(2))
        same = True
        for i, bucket in enumerate(plan):  # every bucket, both ways, byte for byte
            n = bucket_bytes(bucket)
            pack_into(bucket, srcs, a[:n])
            views.pack(i, srcs, b[:n])
            same = same and torch.equal(a[:n], b[:n])
        print(json.dumps({"shape": shape, "equal": same}), flush=True)
        rc |= 0 if same else 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
