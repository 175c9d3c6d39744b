"""Device memory metrics that cannot exceed the card.

torch's allocator statistics count every tensor the process allocated through it, and a colocated
vLLM engine allocates its weights and KV cache through torch: asleep, those tensors stay
"allocated" while their physical memory is unmapped, so `max_memory_allocated` read 101.5 GiB on
an 80 GiB card. Two figures replace it:

- `<phase>/device_memory_used_gib`: the card's total minus its free memory (`torch.cuda.mem_get_info`),
  i.e. everything physically held on the device (this process's tensors and allocator cache, an
  awake engine's pool, other processes). Sampled at the end of every phase (the allocator keeps
  its cached blocks until an offload empties them, so a phase's reserved peak is still held
  there); the update reports the largest sample of the step (rollout, log-prob, teacher, values,
  critic_update, update ends) as `perf/device_memory_used_gib`.
- `<phase>/peak_added_gib`: the allocator's peak during the phase above what was allocated when it
  began: the phase's own activations, gradients and temporaries (the actor update's is
  `perf/peak_added_gib`).

The phases are the memory plan's (trainer/memory_plan.py), so each figure sits beside the plan's
row of the same name: `rollout`, `teacher`, the critic's `values` and `critic_update`, `update`.

These describe one card, and so does `*/offload_freed_gib` (`perf/` for the megatron actor,
`teacher/`, `critic_update/` for the megatron critic), what a role's last offload freed on its card: the largest is the card that held the
most state, the one the plan's per-device figure counts (under PP its largest stage). The driver
keeps one rank's metrics per DP replica (under megatron TP rank 0 of the last pipeline stage), so a
backend that splits the model over cards gathers them first (`fullest_cards`): each figure becomes
the fullest card's among the replica's ranks, and under pipeline parallelism every stage's device
in use gets its own key (`<phase>/stage<k>_device_memory_used_gib`), beside the plan's figure per
stage.

And the host: the update reports its process's resident set at its end (`perf/host_rss_gib`) and
the largest it has been since the process began (`perf/host_peak_rss_gib`, the kernel's high-water
mark: the build's peak included), from /proc/self/status (0 where there is none). In the update a
sleeping engine's pinned copy and a host optimizer's state are all held, so the first sits beside
the plan's host figure for the node when one process holds the node's roles (one GPU); a worker
process holds its own roles' share on more. A run of the 8b-torch row read 161.8 GiB resident
against 159.29 planned (2x H200, 2026-11-28).

And what the allocator asked of the driver during a phase (`rollout/...` around `generate`,
`update/...`, `teacher/...`, `values/...` and `critic_update/...` over those phases): `alloc_retries`, requests
that failed until it released its cached blocks (each release synchronizes the device),
`device_mallocs` and `device_frees`, its calls to the driver. A step-to-step spread in a phase's
time beside a spread in these is the allocator's. They are the counts of the rank whose metrics the
driver keeps: under megatron, one card a replica.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_peak_used_gib = 0.0  # largest phase-end sample since the last update reported it (this process)
_COUNTS = ("alloc_retries", "device_mallocs", "device_frees")
_STATS = ("num_alloc_retries", "num_device_alloc", "num_device_free")  # torch.cuda.memory_stats keys
_phase_counts: tuple[int, ...] = (0, 0, 0)  # allocator_counts() at the last phase_start
# the key endings of card_figures
_CARD_FIGURES = ("device_memory_used_gib", "peak_added_gib", "offload_freed_gib")


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


def allocator_counts() -> tuple[int, ...]:
    """This process's allocator so far: failed driver requests it retried after releasing its
    cache, its allocation calls and its free calls to the driver (zeros without CUDA)."""
    if not torch.cuda.is_available():
        return (0, 0, 0)
    stats = torch.cuda.memory_stats()
    return tuple(int(stats.get(key, 0)) for key in _STATS)


def allocator_metrics(phase: str, before: tuple[int, ...]) -> dict[str, float]:
    """`<phase>/alloc_retries`, `/device_mallocs`, `/device_frees` since `before` (allocator_counts)."""
    return {
        f"{phase}/{name}": float(now - then) for name, now, then in zip(_COUNTS, allocator_counts(), before)
    }


def phase_start() -> int:
    """Start measuring a phase's allocator peak and its calls to the driver; returns the bytes
    allocated at its start."""
    global _phase_counts
    torch.cuda.reset_peak_memory_stats()
    _phase_counts = allocator_counts()
    return torch.cuda.memory_allocated()


def peak_added_gib(start_allocated: int) -> float:
    """The allocator's peak since `phase_start` above what was allocated then."""
    return max(0, torch.cuda.max_memory_allocated() - start_allocated) / 2**30


def card_figures(metrics: dict[str, float]) -> dict[str, float]:
    """The figures among `metrics` that describe one card (`*device_memory_used_gib`,
    `*peak_added_gib`, `*offload_freed_gib`): across cards the fullest one's is kept."""
    return {key: value for key, value in metrics.items() if key.endswith(_CARD_FIGURES)}


def fullest_cards(cards: Sequence[tuple[int, dict[str, float]]], phase: str, stages: int) -> dict[str, float]:
    """One DP replica's card figures from every card of it, each given as (its pipeline stage, its
    `card_figures`): every figure the fullest card's, and with `stages` > 1 each stage's fullest
    `<phase>/device_memory_used_gib` again under `<phase>/stage<k>_device_memory_used_gib`."""
    used = f"{phase}/device_memory_used_gib"
    out = {key: max(figures[key] for _, figures in cards) for key in cards[0][1]}
    if stages > 1:
        for stage in range(stages):
            samples = [figures[used] for k, figures in cards if k == stage]
            assert samples, f"no card of pipeline stage {stage} among {len(cards)}"
            out[f"{phase}/stage{stage}_device_memory_used_gib"] = max(samples)
    return out


def phase_metrics(phase: str, start_allocated: int) -> dict[str, float]:
    """A phase's figures, from `phase_start`'s bytes: its allocator peak above them
    (`<phase>/peak_added_gib`), the device in use at its end (`<phase>/device_memory_used_gib`: its
    cache still holds its reserved peak; the sample counts toward the step's largest) and its calls
    to the driver."""
    return {
        f"{phase}/peak_added_gib": peak_added_gib(start_allocated),
        f"{phase}/device_memory_used_gib": note_phase_end(),
        **allocator_metrics(phase, _phase_counts),
    }


def host_rss_gib() -> tuple[float, float]:
    """(resident, its high-water mark) of this process in GiB, from /proc/self/status (VmRSS,
    VmHWM); (0, 0) where the file is missing."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS:", "VmHWM:")))
    except OSError:
        return 0.0, 0.0
    kib = {key: int(value.split()[0]) for key, value in fields.items()}
    return kib.get("VmRSS", 0) / 2**20, kib.get("VmHWM", 0) / 2**20


def update_metrics(start_allocated: int) -> dict[str, float]:
    """The actor update's figures: `phase_metrics`, its allocator peak under the name runs have
    logged it by (`perf/peak_added_gib`), and the step's largest sample, which only the update
    takes (a colocated critic's phases add their samples to it)."""
    metrics = phase_metrics("update", start_allocated)
    metrics["perf/peak_added_gib"] = metrics.pop("update/peak_added_gib")
    metrics["perf/device_memory_used_gib"] = take_peak_used_gib()
    metrics.update(host_metrics())
    return metrics


def host_metrics() -> dict[str, float]:
    """The update's host figures (the module docstring), on any device."""
    rss, peak = host_rss_gib()
    return {"perf/host_rss_gib": rss, "perf/host_peak_rss_gib": peak}
