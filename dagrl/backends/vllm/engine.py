"""Starting an in-process vLLM engine shard in a pool worker: shared by the rollout and the
standalone teacher backends.

The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `external_launcher`): it reuses
the pool's process group, so TP=k takes k consecutive workers and each TP group is an
independent replica.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Any

import numpy as np
import torch

from dagrl.backends.memory import share_of_card


def prepare_process(rank: int, world_size: int) -> None:
    """What vLLM's external launcher reads from the process before the engine starts."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = "0"  # Ray shows each worker only its own GPU, as device 0
    os.environ["WORLD_SIZE"] = str(world_size)
    if not torch.distributed.is_initialized():
        # a one-worker pool has no process group; vLLM would otherwise build one from env://
        store = torch.distributed.HashStore()
        torch.distributed.init_process_group("nccl", store=store, rank=0, world_size=1)


@contextlib.contextmanager
def rng_kept():
    """vLLM seeds every RNG of the process at start; the trainer's streams must not move."""
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.cuda.get_rng_state_all())
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        torch.cuda.set_rng_state_all(state[3])


def start_engine(kwargs: dict[str, Any], rank: int, world_size: int, card_gib: float | None = None):
    """(vllm.LLM, its model module, seconds to start) for this worker's shard; `card_gib`: the
    device size the memory plan counted where trainer.gpu_memory_gib set one (share_of_card)."""
    prepare_process(rank, world_size)
    from vllm import LLM

    if card_gib is not None:
        device_gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
        share = share_of_card(kwargs["gpu_memory_utilization"], card_gib, device_gib)
        kwargs = {**kwargs, "gpu_memory_utilization": share}

    start = time.perf_counter()
    with rng_kept():
        llm = LLM(**kwargs)
    seconds = time.perf_counter() - start
    # in-process engine: apply_model hands back vLLM's own module (no serialisation)
    model = llm.apply_model(lambda model: model)[0]
    return llm, model, seconds
