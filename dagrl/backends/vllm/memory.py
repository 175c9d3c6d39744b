"""Memory of a vLLM engine per device, in bytes.

vLLM takes `gpu_memory_utilization` × the card at start (weights, activations, CUDA graphs and the
KV cache inside that share; vllm/v1/worker/utils.py::request_memory refuses to start when less is
free). Asleep (sleep mode, `rollout.free_cache_engine`), level 1 moves the weights (with the
sampler's tables made beside them) to pinned host memory (sleep_backup.py: what that pins) and
level 2 drops them; both free the KV cache. Sleep releases only what vLLM's cumem allocator
holds under its "weights" and "kv_cache" tags (vllm/device_allocator/cumem.py
CuMemAllocator.sleep; the tags are opened around load_model and initialize_from_config in
vllm/v1/worker/gpu_worker.py). Everything else the engine allocated stays on the device:
- the CUDA graphs (gpu_worker.py compile_or_warm_up_model -> model_runner.py capture_model, after
  the KV cache, outside both tags): torch's graph pool and the instantiated graphs, one per batch
  size of `capture_sizes` in each of FULL (decode) and PIECEWISE mode, every layer's kernels in
  each (v1/worker/gpu/cudagraph_utils.py CudaGraphManager), twice with an adapter served
  (lora/utils.py get_captured_lora_counts: 0 and max_loras + 1 active adapters);
- what vLLM reports as non-torch memory (kernel modules, cuBLAS: 0.22 GiB at every shape measured)
  and the rest it allocated outside the tags (the model runner's request and input buffers, sized
  by max_num_seqs): 0.29-0.41 GiB with the non-torch memory, beside the graphs and the context, at
  the shapes measured;
- the process's CUDA context (0.51 GiB on an H200, 0.52 on an H100: the card in use at vLLM's
  start, "Free memory on device (139.29/139.8 GiB) on startup").
The logits are computed outside the graphs and the sampler's vocabulary-sized tables are made
under the "weights" tag (they leave the device with the weights), so the vocabulary does not
enter. The plan's CONTEXT_BYTES (trainer/memory_plan.py, 1.0 GiB) holds the context, the non-torch
memory and the buffers (0.80-0.92 GiB measured); `asleep_bytes` counts the graphs.
"""

from __future__ import annotations

import math

from dagrl.backends.communicators import GROUP_BYTES
from dagrl.backends.memory import GIB, RoleMemory, param_width
from dagrl.backends.model_shape import ModelShape
from dagrl.backends.vllm.engine_args import SLEEPING_SHARE, TEACHER_GPU_MEMORY_UTILIZATION, serves_adapter
from dagrl.backends.vllm.sleep_backup import backup_bytes, default_max_num_seqs

# vLLM 0.26's CUDA graphs per model layer at its default 51 capture sizes ("Graph capturing finished
# ... took"): 0.15 GiB at 4 layers (the calculator's tiny model), 0.50-0.53 at 28 (Qwen3-0.6B and
# 1.7B shapes), 0.78-1.00 at 36 (4B, 8B) on H200s and H100s (bench/gpu_matrix.py rows, 2026-11-27/28).
# With CONTEXT_BYTES a sleeping engine's device then reads 1.08 / 1.56 / 1.72 GiB against the 0.95 /
# 1.37-1.39 / 1.69-1.91 vLLM logged at its first sleep, before the trainer built ("Sleep mode freed
# ..., X GiB memory is still in use", less the 0.60-0.61 GiB of another process where vLLM's start-up
# line shows one: bench/gpu_matrix.py's own context where it built the row's model on the card).
GRAPH_BYTES_PER_LAYER = 0.02 * GIB
DEFAULT_CAPTURE_SIZES = 51  # what GRAPH_BYTES_PER_LAYER was measured at
LARGEST_CAPTURE = 512  # vllm/config/vllm.py: min(2 x max_num_seqs, 512, max_num_batched_tokens)
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's smaller default (cards under 70 GiB; 1024 above): 512 either way
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


def capture_sizes(max_num_seqs: int | None, max_num_batched_tokens: int | None) -> int:
    """How many batch sizes vLLM captures CUDA graphs for (vllm/config/vllm.py,
    _set_cudagraph_sizes): 1, 2, 4, every 8 below 256 and every 16 from 256 up to the largest, and
    max_num_batched_tokens where it is the largest; None is vLLM's default (51 sizes, up to 512)."""
    largest = min(2 * (max_num_seqs or DEFAULT_MAX_NUM_SEQS), LARGEST_CAPTURE)
    if max_num_batched_tokens is not None and max_num_batched_tokens <= largest:
        largest = max_num_batched_tokens
        sizes = {largest}
    else:
        sizes = set()
    sizes |= {s for s in (1, 2, 4) if s <= largest}
    sizes |= set(range(8, min(largest + 1, 256), 8)) | set(range(256, largest + 1, 16))
    return len(sizes)


def asleep_bytes(shape: ModelShape, spec) -> float:
    """What a sleeping engine keeps on its device besides CONTEXT_BYTES: its CUDA graphs, per layer
    and captured batch size (none with enforce_eager), twice with the policy's adapter served; on
    every TP shard alike (each captures every size; measured at TP 1)."""
    r = spec.rollout
    if r.enforce_eager:
        return 0.0
    graphs = capture_sizes(r.max_num_seqs, r.max_num_batched_tokens) / DEFAULT_CAPTURE_SIZES
    return GRAPH_BYTES_PER_LAYER * shape.layers * graphs * (2 if serves_adapter(spec) else 1)


def idle_bytes(utilization: float, card_bytes: float, asleep: float | None) -> dict[str, float]:
    """What the engine holds while a colocated role has the device: `asleep` (None: it stays awake)."""
    if asleep is not None:
        return {"asleep": asleep}
    return pool_bytes(utilization, card_bytes)


def host_bytes(
    shape: ModelShape, width: int, tp: int, sleep_level: int, sleeps: bool, max_num_seqs: int
) -> float:
    """Host memory an asleep engine keeps: at level 1 the pinned copies of its weight-tag segments
    (its weight shard and the sampler's tables sized by max_num_seqs, each segment a power of two:
    sleep_backup.py), held from the first sleep on; at level 2 none."""
    return float(backup_bytes(shape, width, tp, max_num_seqs)[1]) if sleeps and sleep_level == 1 else 0.0


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


def communicators(tp: int) -> dict[str, float]:
    """The NCCL communicator an engine's process makes (backends/communicators.py): at TP > 1 vLLM's
    own over its TP group (PyNcclCommunicator, vllm/distributed/device_communicators/pynccl.py),
    made at start before vLLM measures the memory it takes its share from, so it sits beside that
    share. The torch groups vLLM makes beside it do not talk here: its all-reduces and all-gathers go
    through that communicator (custom all-reduce is off), and it runs no pipeline or data parallel."""
    return {"vllm tp": GROUP_BYTES} if tp > 1 else {}


def rollout_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The vllm rollout's registered estimate: its pool while it samples; asleep (colocated, with
    free_cache_engine) its CUDA graphs on the device and, at level 1, the pinned copy of its
    weight-tag memory on the host (sleep_backup.py); awake beside other roles its pool and the
    sampling transient in every phase."""
    r = spec.rollout
    sleeps = r.free_cache_engine is not False and colocated > 1  # None: unresolved, today's default
    util = r.gpu_memory_utilization or SLEEPING_SHARE
    max_num_seqs = r.max_num_seqs or default_max_num_seqs(card)
    width = param_width(spec.model.dtype)
    host = host_bytes(shape, width, spec.parallel.tp, r.sleep_level, sleeps, max_num_seqs)
    idle = idle_bytes(util, card, asleep_bytes(shape, spec) if sleeps else None)
    active = pool_bytes(util, card)
    if not sleeps and colocated > 1:  # awake beside other roles: the sampling transient stays cached
        rows = math.ceil(cfg.data.train_batch_size * r.n / layout.dp)
        idle["sampling"] = active["sampling"] = rows * shape.vocab * SAMPLING_BYTES_PER_ROW_WORD
    mem = RoleMemory({}, idle, {"rollout": active}, host, stays=not sleeps)
    mem.communicators = communicators(spec.parallel.tp)
    return mem


def teacher_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The standalone teacher's registered estimate: its own devices, never asleep."""
    util = spec.engine_kwargs.get("gpu_memory_utilization", TEACHER_GPU_MEMORY_UTILIZATION)
    pool = pool_bytes(util, card)
    return RoleMemory({}, pool, {"teacher": pool}, stays=True, communicators=communicators(spec.parallel.tp))
