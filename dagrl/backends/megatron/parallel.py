"""megatron-core's process groups for one worker process.

The worker has already joined the pool's default process group (NCCL on GPU). megatron's
parallel state is global to the process, so an actor and a reference model colocated in one
worker share it: the second backend checks that it asks for the same layout instead of
re-initialising (validate rejects a colocated ref with other sizes before anything starts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core import parallel_state as mpu
from megatron.core import tensor_parallel

from dagrl.config.schema import MegatronConfig


@dataclass(frozen=True)
class MegatronLayout:
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int | None

    @classmethod
    def of(cls, m: MegatronConfig) -> MegatronLayout:
        return cls(
            m.tensor_model_parallel_size,
            m.pipeline_model_parallel_size,
            m.virtual_pipeline_model_parallel_size,
            m.context_parallel_size,
            m.expert_model_parallel_size,
            m.expert_tensor_parallel_size,
        )


_initialised: MegatronLayout | None = None


def init_parallel(m: MegatronConfig, seed: int) -> MegatronLayout:
    """Create TP/PP/CP/EP/DP groups over the default process group (idempotent per layout)."""
    global _initialised
    layout = MegatronLayout.of(m)
    if _initialised is not None:
        assert _initialised == layout, (
            f"megatron parallel state already set up as {_initialised}; a colocated role asked for {layout}"
        )
        return layout
    if not torch.distributed.is_initialized():
        # a one-worker pool has no process group yet; megatron needs one even of size 1
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        store = torch.distributed.HashStore()
        torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
    )
    # TP ranks get different dropout/init streams, DP replicas the same ones, as megatron expects
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    _initialised = layout
    return layout


def dp_info() -> tuple[int, int, bool]:
    """(dp_rank, dp_size, returns_output): outputs are kept from TP rank 0 of the last PP stage."""
    returns = (
        mpu.get_tensor_model_parallel_rank() == 0
        and mpu.is_pipeline_last_stage(ignore_virtual=True)
        and mpu.get_context_parallel_rank() == 0
    )
    return mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size(), returns
