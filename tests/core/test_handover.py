"""The colocated hand-over on a GPU: the device is settled (garbage collected, torch's cache
emptied) before a role takes it whenever roles take turns, whatever the backends report: vLLM's
wake maps memory through the driver and cannot use blocks torch keeps cached (the 0.6B default
died at step 2's KV-cache wake when a resident trainer's update cache was never returned).

The CUDA calls are recorded in place of a device; the order of events is what is checked."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from dagrl.backends import weight_sync
from dagrl.core.worker import RoleParts, Worker, WorkerParts


class Role:
    def __init__(self, name: str, events: list, offload_returns):
        self.name, self.events, self.returns = name, events, offload_returns

    def offload(self):
        self.events.append(f"{self.name}.offload")
        return self.returns

    def onload(self):
        self.events.append(f"{self.name}.onload")

    # rollout side of a colocated weight refresh
    def begin_weight_update(self):
        self.events.append(f"{self.name}.wake_weights")

    def load_weights(self, buckets):
        return sum(1 for _ in buckets)

    def finish_weight_update(self):
        self.events.append(f"{self.name}.wake_kv")

    def export_weights(self):
        return iter([{"w": torch.zeros(1)}])


@pytest.fixture
def device(monkeypatch):
    """torch.cuda's memory calls, recorded."""
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (70 * 2**30, 80 * 2**30))
    return events


def parts(roles: dict) -> WorkerParts:
    """The worker's input with each role's name standing for its spec (these roles need none)."""
    return WorkerParts.pack([], {name: RoleParts(spec=name) for name in roles})


def by_name(roles: dict):
    return lambda spec, ctx, objective: roles[spec]


def colocated(events: list, trainer_frees, engine_frees) -> Worker:
    roles = {"rollout": Role("rollout", events, engine_frees), "train": Role("train", events, trainer_frees)}
    worker = Worker(parts(roles), list(roles), 0, 1, "cuda", torch.get_num_threads(), build=by_name(roles))
    worker.device = torch.device("cpu")
    worker.build_roles(None, hand_over=True)  # the engine first, asleep before the trainer loads
    events.clear()
    return worker


def test_a_resident_trainer_still_returns_its_cache_before_the_engine_wakes(device):
    worker = colocated(device, trainer_frees=False, engine_frees=True)
    worker.activate("rollout")
    assert device == ["train.offload", "empty_cache", "rollout.onload"]
    report = worker.memory_report()
    assert report == {
        "memory/to_rollout/allocated_gib": 3.0,
        "memory/to_rollout/reserved_gib": 5.0,
        "memory/to_rollout/in_use_gib": 10.0,
    }
    assert worker.memory_report() == {}  # once per report


def test_the_refresh_settles_before_the_engine_maps_its_weights_and_again_before_its_kv_cache(device):
    worker = colocated(device, trainer_frees=False, engine_frees=True)
    nbytes, stages = weight_sync._copy_local(worker, "train", "rollout")
    assert nbytes == 1
    assert list(stages) == ["settle_ms", "wake_weights_ms", "load_ms", "release_ms", "wake_kv_ms"]
    assert all(ms >= 0 for ms in stages.values())
    assert device == [
        "empty_cache",
        "rollout.wake_weights",
        "train.offload",
        "empty_cache",
        "rollout.wake_kv",
    ]
    assert worker.active == "rollout"


def test_where_every_role_stays_resident_the_cache_serves_the_next_phase(device):
    worker = colocated(device, trainer_frees=False, engine_frees=False)  # an engine that never sleeps
    worker.activate("rollout")
    worker.activate("train")
    assert "empty_cache" not in device
    assert set(worker.memory_report()) >= {"memory/to_train/in_use_gib", "memory/to_rollout/in_use_gib"}


def test_building_the_roles_settles_the_device_once_they_are_all_loaded(device):
    events: list[str] = []
    roles = {"rollout": Role("rollout", events, True), "train": Role("train", events, False)}
    worker = Worker(parts(roles), list(roles), 0, 1, "cuda", torch.get_num_threads(), build=by_name(roles))
    worker.build_roles(None, hand_over=True)
    assert events == ["rollout.offload"] and device == ["empty_cache"]


@pytest.fixture(autouse=True)
def heap(monkeypatch):
    """The collector, its frozen set empty before each test and after it (a GPU worker freezes
    what its roles built; the workers here are never shut down but by the tests that say so), and
    the allocator's variable unset during the test and as it was after it (a GPU worker sets it in
    its process; monkeypatch restores only what it saw set)."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    gc.unfreeze()
    yield gc
    gc.unfreeze()


def test_a_gpu_worker_freezes_what_its_roles_built_and_unfreezes_it_at_shutdown(device, heap):
    events: list[str] = []
    roles = {"rollout": Role("rollout", events, True), "train": Role("train", events, False)}
    built = []

    def build(spec, ctx, objective):  # what a backend leaves on the heap (modules, parameters)
        built.append([{"layer": i} for i in range(100)])
        return roles[spec]

    worker = Worker(parts(roles), list(roles), 0, 1, "cuda", torch.get_num_threads(), build=build)
    worker.build_roles(None, hand_over=True)
    assert heap.get_freeze_count() >= 202  # both roles' lists and their dicts, out of the scans
    assert not any(heap.is_tracked(x) and x in heap.get_objects(generation=2) for x in built)
    worker.shutdown()
    assert heap.get_freeze_count() == 0


def test_a_cpu_worker_leaves_the_heap_to_the_collector(heap):
    roles = {"rollout": Role("rollout", [], True), "train": Role("train", [], False)}
    worker = Worker(parts(roles), list(roles), 0, 1, "cpu", torch.get_num_threads(), build=by_name(roles))
    worker.build_roles(None, hand_over=False)
    assert heap.get_freeze_count() == 0


def test_a_gpu_worker_lets_the_allocator_grow_segments_unless_the_user_configured_it(monkeypatch):
    roles = {"train": Role("train", [], False)}
    Worker(parts(roles), list(roles), 0, 1, "cpu", 1, build=by_name(roles))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    Worker(parts(roles), list(roles), 0, 1, "cuda", 1, build=by_name(roles))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    Worker(parts(roles), list(roles), 0, 1, "cuda", 1, build=by_name(roles))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
