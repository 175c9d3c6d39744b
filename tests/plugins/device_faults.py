"""Fault injection written only in tests/: loaded from `external_plugins`, it makes the real
backends raise the real exceptions a GPU run meets, inside the real Ray workers.

`trainer.experiment_name` picks the fault, so that loading this module in a process (the driver,
a test session) changes nothing else:
- `fault-oom-update`: the torch train backend's `train_step` raises `torch.OutOfMemoryError`
  (constructed with CUDA's own wording) on every rank, as an update that does not fit does;
- `fault-vllm-start`: the rollout backend's construction raises the ValueError vLLM raises when
  the GPU has less free memory than `gpu_memory_utilization` asks for.
"""

import torch

from dagrl.backends.hf.rollout import HFRolloutBackend
from dagrl.backends.torch.train import TorchTrainBackend

OOM = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which"
    " 3.12 GiB is free. Of the allocated memory 70.02 GiB is allocated by PyTorch"
)
VLLM = (
    "Free memory on device cuda:0 (3.10/79.19 GiB) on startup is less than desired GPU memory"
    " utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by"
    " other processes."
)

_train_step = TorchTrainBackend.train_step
_rollout_init = HFRolloutBackend.__init__


def _failing_train_step(self, batch):
    if self.cfg.trainer.experiment_name == "fault-oom-update":
        raise torch.OutOfMemoryError(OOM)
    return _train_step(self, batch)


def _failing_rollout_init(self, cfg, ctx):
    if cfg.trainer.experiment_name == "fault-vllm-start":
        raise ValueError(VLLM)
    _rollout_init(self, cfg, ctx)


TorchTrainBackend.train_step = _failing_train_step
HFRolloutBackend.__init__ = _failing_rollout_init
