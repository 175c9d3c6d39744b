"""Folding metrics of micro-batches, mini-batches and DP ranks into one value per key.

Keys ending in `_max` / `_min` keep the extreme; every other key is a (weighted) mean. Backends
fold device tensors (no sync per micro-batch) and convert once per mini-batch. Across ranks, a
card's figures (`<phase>/device_memory_used_gib`, `<phase>/peak_added_gib`, `*/offload_freed_gib`)
keep the fullest card: that is what the memory plan's per-device figure must cover, and uneven DP
shards are not alike; a process's host figures (`perf/host_rss_gib`, `perf/host_peak_rss_gib`)
keep the fullest process. The ranks folded here are those the driver keeps, one per DP replica: a
backend that splits a replica over cards (megatron's TP, CP, PP) folds that replica's cards first
(backends/device_memory.py: fullest_cards).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def fold(acc: dict, new: dict, weight: float) -> dict:
    """Fold one micro-batch's metrics into `acc` (weights of a mini-batch sum to 1)."""
    for key, value in new.items():
        if key not in acc:
            acc[key] = value if key.endswith(("_max", "_min")) else value * weight
        elif key.endswith("_max"):
            acc[key] = torch.maximum(torch.as_tensor(acc[key]), torch.as_tensor(value))
        elif key.endswith("_min"):
            acc[key] = torch.minimum(torch.as_tensor(acc[key]), torch.as_tensor(value))
        else:
            acc[key] = acc[key] + value * weight
    return acc


def reduce(key: str, values: Iterable[float]) -> float:
    """One value from several mini-batches or ranks."""
    values = [float(v) for v in values]
    if key.endswith(("_max", "device_memory_used_gib", "peak_added_gib", "offload_freed_gib", "rss_gib")):
        return max(values)
    if key.endswith("_min"):
        return min(values)
    return float(np.mean(values))


def reduce_all(dicts: list[dict]) -> dict[str, float]:
    """Per-key `reduce` over dicts that may not all carry every key."""
    keys = set().union(*dicts) if dicts else set()
    return {k: reduce(k, [d[k] for d in dicts if k in d]) for k in keys}
