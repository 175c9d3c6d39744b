"""Folding metrics over ranks: the memory figures keep the fullest card."""

from __future__ import annotations

from dagrl.core.metrics import reduce_all


def test_device_memory_across_ranks_is_the_fullest_card():
    # two DP replicas with uneven shards: the plan's per-device figure is checked against the
    # fuller card, not their mean; the allocator's peak above the phase's start likewise
    replicas = [
        {"update/device_memory_used_gib": 41.0, "perf/peak_added_gib": 9.0, "timing_s/update": 2.0},
        {"update/device_memory_used_gib": 57.0, "perf/peak_added_gib": 7.0, "timing_s/update": 4.0},
    ]
    assert reduce_all(replicas) == {
        "update/device_memory_used_gib": 57.0,
        "perf/peak_added_gib": 9.0,
        "timing_s/update": 3.0,
    }


def test_what_an_offload_freed_across_ranks_is_the_fullest_cards():
    # a card's figure as the others: the replica that held (and so freed) the most, as the plan counts
    replicas = [{"perf/offload_freed_gib": 3.0}, {"perf/offload_freed_gib": 3.5}]
    assert reduce_all(replicas) == {"perf/offload_freed_gib": 3.5}


def test_host_resident_memory_across_ranks_is_the_fullest_process():
    replicas = [
        {"perf/host_rss_gib": 80.0, "perf/host_peak_rss_gib": 95.0},
        {"perf/host_rss_gib": 82.5, "perf/host_peak_rss_gib": 90.0},
    ]
    assert reduce_all(replicas) == {"perf/host_rss_gib": 82.5, "perf/host_peak_rss_gib": 95.0}
