"""Memory of a vLLM engine per device, in bytes.

vLLM takes `gpu_memory_utilization` × the card at start (weights, activations, CUDA graphs and the
KV cache inside that share; vllm/v1/worker/utils.py::request_memory refuses to start when less is
free). Asleep (sleep mode, `rollout.free_cache_engine`), level 1 moves the weights to host memory
and level 2 drops them; both free the KV cache. What an asleep engine still holds (CUDA graph
pools, the sampler's buffers) is taken as ASLEEP_RESIDUE_BYTES until measured otherwise
(bench/memory_plan_gpu.py).
"""

from __future__ import annotations

import math

from dagrl.backends.memory import GIB, RoleMemory, param_width
from dagrl.backends.model_shape import ModelShape
from dagrl.backends.vllm.engine_args import SLEEPING_SHARE, TEACHER_GPU_MEMORY_UTILIZATION

ASLEEP_RESIDUE_BYTES = 0.5 * 2**30
# What vLLM 0.26 counts inside its share besides the weights and the KV cache (gpu_worker.py's
# "Actual usage" line: peak activation + non-torch memory + CUDA graphs): 1.16 / 1.58 / 2.42 /
# 2.74 GiB at the 0.6B / 1.7B / 4B / 8B Qwen3 shapes on an H200 (2026-11-27); counted above them
ENGINE_OVERHEAD_BYTES = 2.5 * GIB
KV_BLOCK_TOKENS = 16  # vLLM's block size on CUDA: a sequence takes whole blocks
KV_HEADROOM = 1.25  # over the step's sequences at full length: no request waits for blocks
# What a generate takes beyond the engine's share, per sequence and vocabulary word (the sampler's
# fp32 logits, log-probs and their copies): the rollout phase measured 2.5 GiB (256 sequences) and
# 5.7 GiB (512) above the plan at the 0.6B shape, the torch trainer's fp32 gradients left out
# (bench/gpu_matrix.py rows, 2026-11-26/27). Asleep, the hand-over returns it before the update;
# awake, torch keeps it cached for the next phases, so an awake engine counts it throughout.
SAMPLING_BYTES_PER_ROW_WORD = 64


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


def kv_bytes_per_token(shape: ModelShape, width: int, tp: int) -> float:
    """K and V of every layer for one token, on one TP shard (kv heads split over TP, at least one)."""
    return 2 * shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * width


def awake_share(shape: ModelShape, width: int, tp: int, rows: int, context: int, card: float) -> float:
    """The gpu_memory_utilization of an engine that stays awake beside a trainer: its weight
    shard, what vLLM keeps besides (ENGINE_OVERHEAD_BYTES) and a KV cache for `rows` sequences of
    `context` tokens in whole blocks, with KV_HEADROOM; rounded up to 0.01 of the card and capped
    at SLEEPING_SHARE (vLLM's share is of the whole card: request_memory = share x total)."""
    blocks = rows * math.ceil(context / KV_BLOCK_TOKENS)
    kv = blocks * KV_BLOCK_TOKENS * kv_bytes_per_token(shape, width, tp) * KV_HEADROOM
    need = shape.params * width / tp + ENGINE_OVERHEAD_BYTES + kv
    return min(SLEEPING_SHARE, math.ceil(100 * need / card) / 100)


def rollout_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The vllm rollout's registered estimate: its pool while it samples; asleep (colocated, with
    free_cache_engine) a residue on the device and, at level 1, its weight shard on the host; awake
    beside other roles its pool and the sampling transient in every phase."""
    r = spec.rollout
    sleeps = r.free_cache_engine is not False and colocated > 1  # None: unresolved, today's default
    util = r.gpu_memory_utilization or SLEEPING_SHARE
    host = host_bytes(shape, param_width(spec.model.dtype), spec.parallel.tp, r.sleep_level, sleeps)
    idle = idle_bytes(util, card, sleeps)
    active = pool_bytes(util, card)
    if not sleeps and colocated > 1:  # awake beside other roles: the sampling transient stays cached
        rows = math.ceil(cfg.data.train_batch_size * r.n / layout.dp)
        idle["sampling"] = active["sampling"] = rows * shape.vocab * SAMPLING_BYTES_PER_ROW_WORD
    return RoleMemory({}, idle, {"rollout": active}, host, stays=not sleeps)


def teacher_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The standalone teacher's registered estimate: its own devices, never asleep."""
    util = spec.engine_kwargs.get("gpu_memory_utilization", TEACHER_GPU_MEMORY_UTILIZATION)
    pool = pool_bytes(util, card)
    return RoleMemory({}, pool, {"teacher": pool}, stays=True)
