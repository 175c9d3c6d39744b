"""Colocated start-up: an engine that reserves a share of the device is built first and hands the
device over before the trainer is built, so it never asks for its pool while the trainer's state
sits on the GPU (the hf rollout stands in for the engine on the CPU)."""

from __future__ import annotations

import torch

from dagrl.backends import build_backend
from dagrl.backends.registry import startup_order
from dagrl.config.role_specs import build_role_specs
from dagrl.config.validate import resolve_defaults
from dagrl.core.worker import ParallelContext, Worker
from dagrl.trainer.setup import worker_parts
from tests.conftest import compose_config


def ordered(*overrides: str) -> list[str]:
    cfg = compose_config(*overrides)
    specs = build_role_specs(cfg, ["train", "rollout", "ref"])
    return startup_order(specs[r] for r in ["train", "rollout", "ref"])


def test_the_vllm_engine_starts_before_the_colocated_trainer():
    assert ordered("actor_rollout_ref.rollout.name=vllm") == ["rollout", "train", "ref"]
    assert ordered() == ["train", "rollout", "ref"]  # the hf rollout reserves nothing at start


def test_each_role_hands_the_device_over_before_the_next_is_built():
    cfg = compose_config("data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    resolve_defaults(cfg)
    events: list[str] = []

    def build(spec, ctx, objective):
        backend = build_backend(spec, ctx, objective)
        role = spec.name
        events.append(f"build {role}")
        offload = backend.offload

        def recorded():
            events.append(f"offload {role}")
            return offload()

        backend.offload = recorded
        return backend

    parts = worker_parts(cfg, build_role_specs(cfg, ["rollout", "train"]))
    worker = Worker(parts, ["rollout", "train"], 0, 1, "cpu", threads=1, build=build)
    worker.build_roles(ParallelContext(0, 1, torch.device("cpu")), hand_over=True)
    assert events == ["build rollout", "offload rollout", "build train"]
    assert worker.active == "train"
    events.clear()
    worker.build_roles(ParallelContext(0, 1, torch.device("cpu")), hand_over=False)  # a CPU worker
    assert events == ["build rollout", "build train"]
