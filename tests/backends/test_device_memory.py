"""dagrl/backends/device_memory.py: what the allocator asked of the driver during a phase, from
torch's allocator statistics (a fake CUDA here: the figures are differences of its counters)."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends import device_memory


class FakeCuda:
    """The torch.cuda calls device_memory makes, with counters a test moves between phases."""

    def __init__(self):
        self.stats = {"num_alloc_retries": 2, "num_device_alloc": 40, "num_device_free": 7}
        self.used_gib = 20  # of an 80 GiB card

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda: dict(self.stats))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 2**30)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**30)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: ((80 - self.used_gib) * 2**30, 80 * 2**30))

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


def test_a_critic_phase_reports_under_its_own_name_and_leaves_the_step_peak_to_the_update(monkeypatch):
    """The critic's values pass ends with 70 GiB in use, the actor's update later with 60: each
    phase's figures under its name, and the update's step figure still the critic's 70 (a critic
    phase samples the step's peak, only the update takes it)."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    device_memory.take_peak_used_gib()  # a step of its own: no earlier test's samples
    allocated = device_memory.phase_start()
    cuda.phase(retries=0, mallocs=3, frees=1)
    cuda.used_gib = 70
    assert device_memory.phase_metrics("values", allocated) == {
        "values/peak_added_gib": 2.0,
        "values/device_memory_used_gib": 70.0,
        "values/alloc_retries": 0.0,
        "values/device_mallocs": 3.0,
        "values/device_frees": 1.0,
    }
    cuda.used_gib = 60
    update = device_memory.update_metrics(device_memory.phase_start())
    assert update["update/device_memory_used_gib"] == 60.0 and update["perf/device_memory_used_gib"] == 70.0
    assert update["perf/peak_added_gib"] == 2.0 and "update/peak_added_gib" not in update


def test_the_update_reports_its_process_resident_host_memory(monkeypatch):
    """The update's host figures are this process's VmRSS and VmHWM: a 256 MiB buffer touched in
    the test moves both by about its size."""
    FakeCuda().install(monkeypatch)
    before = device_memory.update_metrics(device_memory.phase_start())
    rss, peak = before["perf/host_rss_gib"], before["perf/host_peak_rss_gib"]
    assert 0 < rss <= peak, before
    held = torch.ones(2**26, dtype=torch.float32)  # 256 MiB, every page written
    after = device_memory.update_metrics(device_memory.phase_start())
    assert after["perf/host_rss_gib"] - rss == pytest.approx(0.25, abs=0.05), (before, after)
    assert after["perf/host_peak_rss_gib"] >= after["perf/host_rss_gib"] > rss
    del held


def test_host_figures_are_zero_without_proc(monkeypatch):
    import builtins

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert device_memory.host_rss_gib() == (0.0, 0.0)


def test_without_cuda_the_counts_are_zero(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_memory.allocator_counts() == (0, 0, 0)
    assert set(device_memory.allocator_metrics("rollout", (0, 0, 0)).values()) == {0.0}


def _card(used: float, step_peak: float, added: float) -> dict[str, float]:
    return {
        "update/device_memory_used_gib": used,
        "perf/device_memory_used_gib": step_peak,
        "perf/peak_added_gib": added,
    }


def test_each_pipeline_stage_keeps_its_fullest_card():
    """PP2 × TP2: the rank the driver keeps (TP 0 of the last stage) reports every card of its
    replica: each stage's fullest under its own key, each figure the fullest card's."""
    cards = [
        (0, _card(57.0, 57.5, 9.0)),
        (0, _card(57.7, 57.7, 9.5)),  # TP 1 of the first stage: the fullest card
        (1, _card(55.8, 56.0, 4.0)),  # TP 0 of the last stage: the one the driver keeps
        (1, _card(55.1, 58.2, 4.5)),  # the step's largest sample was on this card (a log-prob pass)
    ]
    assert device_memory.fullest_cards(cards, "update", stages=2) == {
        "update/device_memory_used_gib": 57.7,
        "update/stage0_device_memory_used_gib": 57.7,
        "update/stage1_device_memory_used_gib": 55.8,
        "perf/device_memory_used_gib": 58.2,
        "perf/peak_added_gib": 9.5,
    }


def test_four_stages_each_get_a_key_and_the_fullest_may_be_in_the_middle():
    """PP4 × TP2: each stage's two TP cards (GiB in use), first stage to last."""
    used = [(40.0, 41.0), (44.0, 43.0), (45.5, 45.0), (39.0, 39.5)]
    cards = [(stage, _card(gib, gib, 1.0 + stage)) for stage, pair in enumerate(used) for gib in pair]
    figures = device_memory.fullest_cards(cards, "update", stages=4)
    assert [figures[f"update/stage{k}_device_memory_used_gib"] for k in range(4)] == [41.0, 44.0, 45.5, 39.5]
    assert figures["update/device_memory_used_gib"] == figures["perf/device_memory_used_gib"] == 45.5
    assert figures["perf/peak_added_gib"] == 4.0


def test_without_a_pipeline_the_fullest_tp_rank_and_no_stage_keys():
    cards = [(0, _card(30.0, 30.0, 2.0)), (0, _card(31.5, 31.5, 2.5))]  # TP 0 (reported), TP 1
    assert device_memory.fullest_cards(cards, "update", stages=1) == _card(31.5, 31.5, 2.5)


def test_the_teacher_pass_per_stage():
    cards = [
        (0, {"teacher/device_memory_used_gib": 30.0, "teacher/peak_added_gib": 3.0}),
        (1, {"teacher/device_memory_used_gib": 28.0, "teacher/peak_added_gib": 5.0}),
    ]
    assert device_memory.fullest_cards(cards, "teacher", stages=2) == {
        "teacher/device_memory_used_gib": 30.0,
        "teacher/stage0_device_memory_used_gib": 30.0,
        "teacher/stage1_device_memory_used_gib": 28.0,
        "teacher/peak_added_gib": 5.0,
    }


def test_the_card_figures_are_the_per_card_memory_keys(monkeypatch):
    """What the ranks gather: the device in use, the phase's peak and what the last offload freed
    on the card (under PP the largest stage's, the one the plan counts), not the allocator's counts."""
    FakeCuda().install(monkeypatch)
    metrics = device_memory.update_metrics(device_memory.phase_start())
    assert set(device_memory.card_figures(metrics)) == set(_card(0, 0, 0))
    teacher = {
        "teacher/device_memory_used_gib": 1.0,
        "teacher/peak_added_gib": 1.0,
        "teacher/offload_freed_gib": 1.0,
    }
    assert set(device_memory.card_figures(teacher)) == set(teacher)
