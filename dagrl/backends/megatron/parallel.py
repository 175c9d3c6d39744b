"""megatron-core's process groups for one worker process.

The worker has already joined the pool's default process group (NCCL on GPU). megatron's
parallel state is global to the process, so an actor and a reference model colocated in one
worker share it: the second backend checks that it asks for the same layout instead of
re-initialising (validate rejects a colocated ref with other sizes before anything starts).
Beside megatron's groups: a gloo group of each DP replica's ranks, over which the per-card memory
figures are gathered (`replica_figures`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core import parallel_state as mpu
from megatron.core import tensor_parallel

from dagrl.backends import device_memory
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
_replica_group: torch.distributed.ProcessGroup | None = None
# megatron's default rank order, named here because replica_group's ranks follow from it
_ORDER = "tp-cp-ep-dp-pp"


def init_parallel(m: MegatronConfig, seed: int) -> MegatronLayout:
    """Create TP/PP/CP/EP/DP groups over the default process group (idempotent per layout)."""
    global _initialised, _replica_group
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
        order=_ORDER,
    )
    _replica_group = _make_replica_groups(layout)
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


def replica_group() -> torch.distributed.ProcessGroup:
    """This rank's DP replica: its model-parallel ranks (TP × CP × PP), a gloo group. megatron has
    none with CP, and a collective over a NCCL group that megatron never talks over (its
    model-parallel one under the distributed optimizer) would make a communicator whose buffers
    sit on the cards the memory figures measure (docs/memory.md); gloo holds no device memory."""
    assert _replica_group is not None, "init_parallel has not run"
    return _replica_group


def gather_fullest_cards(figures: dict[str, float], phase: str) -> dict[str, float]:
    """This rank's card figures of `phase` (device_memory.card_figures) as the fullest card's among
    its DP replica's ranks, with each pipeline stage's own (device_memory.fullest_cards): the driver
    keeps the metrics of one rank per replica (dp_info). A collective: every rank of the replica
    calls it, with the same keys."""
    group, keys, stage = replica_group(), sorted(figures), mpu.get_pipeline_model_parallel_rank()
    row = torch.tensor([stage, *(figures[k] for k in keys)], dtype=torch.float64)
    rows = [torch.empty_like(row) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(rows, row, group=group)
    cards = [(int(r[0]), dict(zip(keys, r[1:].tolist()))) for r in rows]
    return device_memory.fullest_cards(cards, phase, mpu.get_pipeline_model_parallel_world_size())


def replica_figures(metrics: dict[str, float], phase: str) -> dict[str, float]:
    """A phase's `metrics` as the driver should see them from this rank: the card figures among
    them (device_memory.card_figures) the fullest card's of the DP replica (gather_fullest_cards),
    the rest (the allocator's counts, timings) this rank's. A collective, as gather_fullest_cards."""
    return {**metrics, **gather_fullest_cards(device_memory.card_figures(metrics), phase)}


def _make_replica_groups(layout: MegatronLayout) -> torch.distributed.ProcessGroup:
    """Every replica's group, made on every rank in one order (new_group is a collective of the
    world); returns this rank's."""
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    dp = world // (layout.tp * layout.cp * layout.pp)
    ranks = mpu.RankGenerator(layout.tp, 1, dp, layout.pp, layout.cp, _ORDER).get_ranks("tp-cp-pp")
    groups = [(members, torch.distributed.new_group(members, backend="gloo")) for members in ranks]
    members, group = next((members, group) for members, group in groups if rank in members)
    for megatrons in (mpu.get_model_parallel_group(), mpu.get_context_parallel_group()):
        assert set(torch.distributed.get_process_group_ranks(megatrons)) <= set(members), (members, _ORDER)
    return group
