"""Memory of a vLLM engine per device, in bytes.

vLLM takes `gpu_memory_utilization` × the card at start (weights, activations, CUDA graphs and the
KV cache inside that share; vllm/v1/worker/utils.py::request_memory refuses to start when less is
free). Asleep (sleep mode, `rollout.free_cache_engine`), level 1 moves the weights to host memory
and level 2 drops them; both free the KV cache. What an asleep engine still holds (CUDA graph
pools, the sampler's buffers) is taken as ASLEEP_RESIDUE_BYTES until measured otherwise
(bench/memory_plan_gpu.py).
"""

from __future__ import annotations

from dagrl.backends.memory import RoleMemory, param_width
from dagrl.backends.model_shape import ModelShape
from dagrl.backends.vllm.engine_args import TEACHER_GPU_MEMORY_UTILIZATION

ASLEEP_RESIDUE_BYTES = 0.5 * 2**30


def pool_bytes(utilization: float, card_bytes: float) -> dict[str, float]:
    """The engine's share of the card while awake."""
    return {"pool": utilization * card_bytes}


def idle_bytes(utilization: float, card_bytes: float, sleeps: bool) -> dict[str, float]:
    """What the engine holds while a colocated role has the device."""
    if sleeps:
        return {"asleep": ASLEEP_RESIDUE_BYTES}
    return pool_bytes(utilization, card_bytes)


def host_bytes(shape: ModelShape, width: int, tp: int, sleep_level: int, sleeps: bool) -> float:
    """Host memory an asleep engine keeps (level 1: its weight shard)."""
    return shape.params * width / tp if sleeps and sleep_level == 1 else 0.0


def rollout_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The vllm rollout's registered estimate: its pool while it samples; asleep (colocated, with
    free_cache_engine) a residue on the device and, at level 1, its weight shard on the host."""
    r = spec.rollout
    sleeps = r.free_cache_engine and colocated > 1
    host = host_bytes(shape, param_width(spec.model.dtype), spec.parallel.tp, r.sleep_level, sleeps)
    idle = idle_bytes(r.gpu_memory_utilization, card, sleeps)
    return RoleMemory({}, idle, {"rollout": pool_bytes(r.gpu_memory_utilization, card)}, host)


def teacher_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The standalone teacher's registered estimate: its own devices, never asleep."""
    util = spec.engine_kwargs.get("gpu_memory_utilization", TEACHER_GPU_MEMORY_UTILIZATION)
    pool = pool_bytes(util, card)
    return RoleMemory({}, pool, {"teacher": pool})
