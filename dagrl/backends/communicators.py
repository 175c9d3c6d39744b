"""NCCL's communicators: what each one holds on its device, outside torch's allocator.

A worker process makes a communicator for a process group at the group's first NCCL collective
(the pool's workers join without binding a device, so torch makes each one lazily), one for every
group object that talks: two groups of the same ranks make two, a group of one rank makes one too.
Their buffers stay until the process ends, so they sit on the device in every phase, whichever role
has it. Each backend's memory estimate names the communicators its role's processes make
(`RoleMemory.communicators`: name -> bytes, from the figures below); colocated roles share one
process per device, so a name two of them give (the pool's default group, megatron's groups) is one
communicator, and the plan adds `nccl_bytes` of the union to every phase of the group's devices.

A pool of one worker counts none: its groups are all of one rank (megatron's default, data-parallel
and gradient-norm groups on one GPU), and the one-GPU rows read within 1 GiB of the plan with them,
inside the plan's CONTEXT_BYTES (docs/gpu_acceptance.md: 1g-0.6b-megatron -0.8 % / +1.1 %). Whether
a one-rank communicator in a one-process world holds what one held beside others (below) is not
measured.

The figures: bench/comm_memory.py's `lazy` mode (how the workers make them) on 2x H200, NCCL 2.28.9
(vLLM 0.26's), torch 2.11, 2026-11-28: the device in use less torch's reserved bytes, per
communicator as made one after another, rounded (docs/memory.md gives the readings).
Measured with two ranks; a larger group connects to more peers and may hold more (not measured).
NVLink multicast (NVLS) was off on that machine; where it is on, NCCL allocates its buffers besides
(not measured).
"""

from __future__ import annotations

from dagrl.backends.memory import GIB

# a group of two ranks at its first collective: 0.473-0.475 each, megatron's groups alike
GROUP_BYTES = 0.47 * GIB
# the process's first communicator read 0.82 (the default group's first all-reduce): a further one's
# 0.47 plus what NCCL sets up once per process; which that part is, was not measured
FIRST_EXTRA_BYTES = 0.35 * GIB
# a group of this rank alone (megatron's data-parallel group at DP 1 under TP or PP): NCCL 2.28
# gives it buffers too (NVIDIA/nccl#2363)
ONE_RANK_BYTES = 0.38 * GIB
# a send/recv pair between two ranks: 0.31 on the sender, 0.56 on the receiver; a pipeline stage
# both sends and receives, so each counts the receiver's
PAIR_BYTES = 0.56 * GIB


def group_bytes(ranks: int) -> float:
    """A group's communicator, by how many ranks the group has."""
    return GROUP_BYTES if ranks > 1 else ONE_RANK_BYTES


def nccl_bytes(communicators: dict[str, float]) -> float:
    """What one process's communicators hold on its device: theirs, plus the first one's set-up."""
    if not communicators:
        return 0.0
    return FIRST_EXTRA_BYTES + sum(communicators.values())
