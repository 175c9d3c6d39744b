"""The NCCL communicators the memory plan counts for a megatron role (backends/megatron/memory.py:
`communicators`) are those of the process groups megatron-core's real step talks over.

Two gloo ranks (tests/megatron_cpu_patch.py) build the backend, run old log-probs, one update and
the weight export (a forward-only role: the build and its log-probs), with every collective and
send/recv recorded with its process group; each group is named as the plan names its communicator.
On the GPU each of those groups makes one NCCL communicator at its first collective
(backends/communicators.py).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.backends.megatron.test_backend import INPUT_KEYS, _backend, make_batch, megatron_config
from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")

M, REF = "actor_rollout_ref.actor.megatron", "actor_rollout_ref.ref.megatron"
# what torch.distributed's collectives and point-to-point calls reach on a ProcessGroup
TALKS = (
    "_allgather_base", "_reduce_scatter_base", "all_gather_single", "all_gather_single_coalesced",
    "all_to_all_single", "allgather", "allgather_coalesced", "allgather_into_tensor_coalesced", "allreduce",
    "allreduce_coalesced", "alltoall", "alltoall_base", "barrier", "broadcast", "gather", "reduce",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "scatter", "send", "recv", "recv_anysource",
)  # fmt: skip
POINT_TO_POINT = ("send", "recv", "recv_anysource")


def _plan_names(distributed_optimizer: bool) -> dict[str, str]:
    """group_name -> the plan's name for its communicator, for the groups megatron made."""
    from megatron.core import parallel_state as mpu

    grad_norm = "intra_distributed_optimizer_instance" if distributed_optimizer else "model_parallel"
    getters = {
        "megatron tp": mpu.get_tensor_model_parallel_group,
        "megatron pp": mpu.get_pipeline_model_parallel_group,
        "megatron embedding": mpu.get_embedding_group,
        "megatron dp": lambda: mpu.get_data_parallel_group(with_context_parallel=True),
        "megatron grad norm": getattr(mpu, f"get_{grad_norm}_group"),
    }
    names = {dist.group.WORLD.group_name: "world"}
    for name, getter in getters.items():
        try:
            names.setdefault(getter().group_name, name)
        except (AssertionError, RuntimeError):  # a group this layout did not make
            continue
    return names


def _traced_step(rank: int, world: int, cfg, batch, forward_only: bool) -> dict[str, int]:
    """The plan's name -> ranks of each group this rank talked over (send/recv apart, under
    '<name> send/recv'); a group the plan has no name for under its own group_name."""
    calls: list[tuple[str, str, int]] = []
    # the class's own attributes (pybind's instancemethod descriptors): getattr gives the unbound
    # builtin, which set back on the class no longer binds self, and the workers live on to run
    # the next test's collectives
    originals = {op: vars(dist.ProcessGroup)[op] for op in TALKS}

    def recorded(op, original):
        def call(self, *args, **kwargs):
            calls.append((self.group_name, op, self.size()))
            return original(self, *args, **kwargs)

        return call

    for op, original in originals.items():
        setattr(dist.ProcessGroup, op, recorded(op, original))
    try:
        backend = _backend(cfg, rank, world, forward_only)
        dp_rank, dp_size, _ = backend.dp_info()
        shard = batch.split(dp_size)[dp_rank]
        backend.forward_logprobs(shard.select(INPUT_KEYS), "old_logprobs")
        if not forward_only:
            backend.train_step(shard)
            for _ in backend.export_weights(to_cpu=True):
                pass
        names = _plan_names(cfg.actor_rollout_ref.actor.megatron.use_distributed_optimizer)
    finally:
        for op, original in originals.items():
            setattr(dist.ProcessGroup, op, original)
    talked = {}
    for group, op, size in calls:
        name = names.get(group, group)
        talked[f"{name} send/recv" if op in POINT_TO_POINT else name] = size
    return talked


LAYOUTS = {
    "tp2": ((f"{M}.tensor_model_parallel_size=2",), False),
    "tp2 sp": ((f"{M}.tensor_model_parallel_size=2", f"{M}.sequence_parallel=true"), False),
    "pp2": ((f"{M}.pipeline_model_parallel_size=2",), False),
    "dp2 without the distributed optimizer": ((f"{M}.use_distributed_optimizer=false",), False),
    "tp2 reference": ((f"{M}.tensor_model_parallel_size=2", f"{REF}.tensor_model_parallel_size=2"), True),
    "pp2 reference": ((f"{M}.pipeline_model_parallel_size=2", f"{REF}.pipeline_model_parallel_size=2"), True),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_plan_counts_the_groups_a_megatron_step_talks_over(name):
    from dagrl.backends.communicators import PAIR_BYTES, group_bytes
    from dagrl.backends.megatron.memory import MegatronLayout, communicators

    overrides, forward_only = LAYOUTS[name]
    cfg = megatron_config(*overrides)
    m = cfg.actor_rollout_ref.actor.megatron
    tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
    layout = MegatronLayout(tp=tp, pp=pp, dp=2 // (tp * pp), workers=2)
    # the tiny model ties its embedding and output layer, as Qwen3 up to 4B does
    planned = communicators(layout, not forward_only, True, m.use_distributed_optimizer)
    for talked in run_distributed(_traced_step, 2, cfg, make_batch(), forward_only):
        traced = {n: group_bytes(size) for n, size in talked.items()}
        traced.update({n: PAIR_BYTES for n in talked if n.endswith("send/recv")})
        assert traced == planned


def test_one_worker_counts_none():
    """On one GPU megatron's groups are all of one rank; the plan's context holds them there."""
    from dagrl.backends.megatron.memory import MegatronLayout, communicators

    assert communicators(MegatronLayout(), True, True, True) == {}
