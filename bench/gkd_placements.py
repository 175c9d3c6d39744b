"""Summarise a GKD placement run for docs/perf.md: step time, teacher seconds, weight-sync seconds
(medians over the steps after the first) and the peak memory of each GPU.

    python bench/gkd_placements.py NAME METRICS_JSONL NVSMI_CSV

METRICS_JSONL is the run's metrics.jsonl; NVSMI_CSV the output of
`nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500` during the run.
"""

from __future__ import annotations

import json
import statistics
import sys


def summarise(name: str, metrics_path: str, nvsmi_path: str) -> str:
    rows = [json.loads(line) for line in open(metrics_path) if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r]
    later = steps[1:] or steps  # the first step pays for CUDA graphs, caches and allocator growth

    def median(key: str) -> float:
        values = [r[key] for r in later if key in r]
        return statistics.median(values) if values else float("nan")

    peak: dict[int, float] = {}
    for line in open(nvsmi_path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            peak[int(parts[0])] = max(peak.get(int(parts[0]), 0.0), float(parts[1]) / 1024)
    gpus = " ".join(f"gpu{i}={gib:.1f}GiB" for i, gib in sorted(peak.items()))
    return (
        f"GKD_PLACEMENT {name} steps={len(steps)} step_s={median('timing_s/step'):.2f}"
        f" teacher_s={median('timing_s/teacher_logprob'):.2f}"
        f" weight_sync_s={median('timing_s/weight_sync'):.2f}"
        f" rollout_s={median('timing_s/rollout'):.2f} update_s={median('timing_s/actor_update'):.2f}"
        f" reward_s={median('timing_s/reward'):.3f} device_used_gib={median('perf/device_memory_used_gib'):.1f}"
        f" peak_used {gpus}"
    )


if __name__ == "__main__":
    print(summarise(*sys.argv[1:4]))
