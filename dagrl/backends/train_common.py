"""What the train backends (torch, megatron) share, as functions they call (no base class):
the learning-rate setter, device-memory figures and the teacher phase's timing and peak."""

from __future__ import annotations

import random
import time

import numpy as np
import torch

from dagrl.backends import device_memory


def allocated_gib() -> float:
    """GiB the CUDA allocator holds now (0 without a GPU)."""
    return torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def set_lr(optimizer, lr: float) -> None:
    """The shared update loop's schedule: every parameter group at `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def teacher_phase_start(device: torch.device) -> tuple[float, float]:
    """Start a teacher pass: the clock, and what the allocator holds now (the phase's own peak is
    measured above it, not the process's)."""
    allocated = device_memory.phase_start() if device.type == "cuda" else 0.0
    return time.perf_counter(), allocated


def teacher_metrics(phase: tuple[float, float], device: torch.device, offload_freed_gib: float) -> dict:
    """The teacher's forward alone (the node's timing_s/<node> adds the transfers to and from it);
    memory figures that cannot exceed the card (backends/device_memory.py)."""
    start, allocated = phase
    metrics = {"timing_s/teacher_forward": time.perf_counter() - start}
    if device.type == "cuda":  # its peak, the device in use at its end, its calls to the driver
        metrics.update(device_memory.phase_metrics("teacher", allocated))
        metrics["teacher/offload_freed_gib"] = offload_freed_gib  # at its last offload
    return metrics


def host_rng_state() -> dict:
    """The process's host random streams (Python, numpy, torch's CPU generator), for a checkpoint:
    a resumed run draws what the uninterrupted one would have. Backends add their device streams."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_host_rng_state(state: dict) -> None:
    """Restore what `host_rng_state` saved."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
