"""Fault injection written only in tests/: loaded from `external_plugins`, it makes the real
backends raise the real exceptions a GPU run meets, inside the real Ray workers.

`trainer.experiment_name` picks the fault, so that loading this module in a process (the driver,
a test session) changes nothing else; the name reaches the workers in the role specs the driver
builds (under `engine_kwargs`), as everything a backend reads does:
- `fault-oom-update`: the torch train backend's `train_step` raises `torch.OutOfMemoryError`
  (constructed with CUDA's own wording) on every rank, as an update that does not fit does;
- `fault-vllm-start`: the rollout backend's construction raises the ValueError vLLM raises when
  the GPU has less free memory than `gpu_memory_utilization` asks for.
"""

from dataclasses import replace

import torch

from dagrl.backends.torch.train import TorchTrainBackend
from dagrl.config import role_specs
from dagrl.registry import BACKENDS

OOM = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which"
    " 3.12 GiB is free. Of the allocated memory 70.02 GiB is allocated by PyTorch"
)
VLLM = (
    "Free memory on device cuda:0 (3.10/79.19 GiB) on startup is less than desired GPU memory"
    " utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by"
    " other processes."
)

FAULT = "test_fault"  # the spec's engine_kwargs entry that carries the fault's name
_train_step = TorchTrainBackend.train_step
_hf = BACKENDS.find("rollout", "hf")
_torch = BACKENDS.find("train", "torch")
_role_spec = role_specs.role_spec


def _spec_with_fault(cfg, name):
    spec = _role_spec(cfg, name)
    fault = cfg.trainer.experiment_name
    if not fault.startswith("fault-"):
        return spec
    return replace(spec, engine_kwargs={**spec.engine_kwargs, FAULT: fault})


def _failing_train_step(self, batch):
    if getattr(self, "fault", None) == "fault-oom-update":
        raise torch.OutOfMemoryError(OOM)
    return _train_step(self, batch)


def _noting_train_factory(spec, ctx, objective):
    backend = _torch.factory(spec, ctx, objective)
    backend.fault = spec.engine_kwargs.get(FAULT)
    return backend


def _failing_rollout_factory(spec, ctx, objective):
    if spec.engine_kwargs.get(FAULT) == "fault-vllm-start":
        raise ValueError(VLLM)
    return _hf.factory(spec, ctx, objective)


role_specs.role_spec = _spec_with_fault
TorchTrainBackend.train_step = _failing_train_step
BACKENDS.entries[("train", "torch")] = replace(_torch, factory=_noting_train_factory)
BACKENDS.entries[("rollout", "hf")] = replace(_hf, factory=_failing_rollout_factory)
