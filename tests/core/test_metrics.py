"""Folding metrics over ranks: the memory figures keep the fullest card."""

from __future__ import annotations

from dagrl.core.metrics import reduce_all


def test_device_memory_across_ranks_is_the_fullest_card():
    # two pipeline stages: the first holds the embeddings, the last the logits; the plan's
    # per-device figure is checked against the fuller one, not their mean
    stages = [
        {"update/device_memory_used_gib": 41.0, "timing_s/update": 2.0},
        {"update/device_memory_used_gib": 57.0, "timing_s/update": 4.0},
    ]
    assert reduce_all(stages) == {"update/device_memory_used_gib": 57.0, "timing_s/update": 3.0}
