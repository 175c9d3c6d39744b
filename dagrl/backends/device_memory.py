"""Device memory metrics that cannot exceed the card.

torch's allocator statistics count every tensor the process allocated through it, and a colocated
vLLM engine allocates its weights and KV cache through torch: asleep, those tensors stay
"allocated" while their physical memory is unmapped, so `max_memory_allocated` read 101.5 GiB on
an 80 GiB card. Two figures replace it:

- `<phase>/device_memory_used_gib`: the card's total minus its free memory (`torch.cuda.mem_get_info`),
  i.e. everything physically held on the device (this process's tensors and allocator cache, an
  awake engine's pool, other processes). Sampled at the end of every phase (the allocator keeps
  its cached blocks until an offload empties them, so a phase's reserved peak is still held
  there); the update reports the largest sample of the step (rollout, log-prob, teacher, update ends).
- `<phase>/peak_added_gib`: the allocator's peak during the phase above what was allocated when it
  began: the phase's own activations, gradients and temporaries.
"""

from __future__ import annotations

import torch

_peak_used_gib = 0.0  # largest phase-end sample since the last update reported it (this process)


def used_gib() -> float:
    """GiB held on the current CUDA device by anything: total minus free."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def note_phase_end() -> float:
    """Sample the device's used memory at the end of a phase; returns the sample (0 without CUDA)."""
    global _peak_used_gib
    if not torch.cuda.is_available():
        return 0.0
    sample = used_gib()
    _peak_used_gib = max(_peak_used_gib, sample)
    return sample


def take_peak_used_gib() -> float:
    """The largest phase-end sample since the last call (this one's sample included); resets it."""
    global _peak_used_gib
    note_phase_end()
    peak, _peak_used_gib = _peak_used_gib, 0.0
    return peak


def phase_start() -> int:
    """Start measuring a phase's allocator peak; returns the bytes allocated at its start."""
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_added_gib(start_allocated: int) -> float:
    """The allocator's peak since `phase_start` above what was allocated then."""
    return max(0, torch.cuda.max_memory_allocated() - start_allocated) / 2**30


def update_metrics(start_allocated: int) -> dict[str, float]:
    """The update's figures, from `phase_start`'s bytes: its allocator peak above them, the device
    in use at its end (its cache still holds its reserved peak), and the step's largest sample."""
    return {
        "perf/peak_added_gib": peak_added_gib(start_allocated),
        "update/device_memory_used_gib": note_phase_end(),
        "perf/device_memory_used_gib": take_peak_used_gib(),
    }
