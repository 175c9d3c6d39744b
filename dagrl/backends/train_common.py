"""What the train backends (torch, megatron) share, as functions they call (no base class):
the learning-rate setter, device-memory figures and the teacher phase's timing and peak."""

from __future__ import annotations

import time

import torch


def allocated_gib() -> float:
    """GiB the CUDA allocator holds now (0 without a GPU)."""
    return torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def set_lr(optimizer, lr: float) -> None:
    """The shared update loop's schedule: every parameter group at `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def teacher_phase_start(device: torch.device) -> float:
    """Start a teacher pass: its own peak memory from here (not the process's), and the clock."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return time.perf_counter()


def teacher_metrics(start: float, device: torch.device, offload_freed_gib: float) -> dict:
    """The teacher's forward alone (the node's timing_s/<node> adds the transfers to and from it)."""
    metrics = {"timing_s/teacher_forward": time.perf_counter() - start}
    if device.type == "cuda":
        metrics["teacher/max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        metrics["teacher/offload_freed_gib"] = offload_freed_gib  # at its last offload
    return metrics
