"""dagrl/backends/device_memory.py: what the allocator asked of the driver during a phase, from
torch's allocator statistics (a fake CUDA here: the figures are differences of its counters)."""

from __future__ import annotations

import torch

from dagrl.backends import device_memory


class FakeCuda:
    """The torch.cuda calls device_memory makes, with counters a test moves between phases."""

    def __init__(self):
        self.stats = {"num_alloc_retries": 2, "num_device_alloc": 40, "num_device_free": 7}

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda: dict(self.stats))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 2**30)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**30)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (60 * 2**30, 80 * 2**30))

    def phase(self, retries: int, mallocs: int, frees: int):
        self.stats["num_alloc_retries"] += retries
        self.stats["num_device_alloc"] += mallocs
        self.stats["num_device_free"] += frees


def test_a_phase_reports_its_own_driver_calls_not_the_process_totals(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    before = device_memory.allocator_counts()
    cuda.phase(retries=3, mallocs=5, frees=4)
    assert device_memory.allocator_metrics("rollout", before) == {
        "rollout/alloc_retries": 3.0,
        "rollout/device_mallocs": 5.0,
        "rollout/device_frees": 4.0,
    }


def test_the_update_counts_from_its_start(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    cuda.phase(retries=9, mallocs=9, frees=9)  # an earlier phase: not the update's
    allocated = device_memory.phase_start()
    cuda.phase(retries=1, mallocs=2, frees=0)
    metrics = device_memory.update_metrics(allocated)
    assert metrics["perf/peak_added_gib"] == 2.0 and metrics["update/device_memory_used_gib"] == 20.0
    assert (
        metrics["update/alloc_retries"],
        metrics["update/device_mallocs"],
        metrics["update/device_frees"],
    ) == (
        1.0,
        2.0,
        0.0,
    )


def test_without_cuda_the_counts_are_zero(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_memory.allocator_counts() == (0, 0, 0)
    assert set(device_memory.allocator_metrics("rollout", (0, 0, 0)).values()) == {0.0}


def test_each_pipeline_stage_keeps_its_fullest_card():
    """Under PP the update's device in use is reported again per stage; folding the ranks keeps the
    fullest card of each stage (two stages of two TP ranks here), and the overall figure the
    fullest of all: the plan prints one figure per stage beside them."""
    from dagrl.core.metrics import reduce_all

    ranks = []
    for stage, used in ((0, 57.0), (0, 56.5), (1, 52.0), (1, 52.5)):
        metrics = {"update/device_memory_used_gib": used}
        metrics.update(device_memory.stage_metrics(metrics, stage, 2))
        ranks.append(metrics)
    assert reduce_all(ranks) == {
        "update/device_memory_used_gib": 57.0,
        "update/stage0_device_memory_used_gib": 57.0,
        "update/stage1_device_memory_used_gib": 52.5,
    }
    assert device_memory.stage_metrics({"update/device_memory_used_gib": 57.0}, 0, 1) == {}  # no PP
    assert device_memory.stage_metrics({}, 1, 2) == {}  # no CUDA: nothing measured
