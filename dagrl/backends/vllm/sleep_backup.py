"""The host memory a vLLM engine asleep at level 1 keeps: a pinned copy of every segment of its
"weights" memory pool, each rounded up to a power of two.

Sleep (vllm/device_allocator/cumem.py, CuMemAllocator.sleep) copies every handle mapped under the
"weights" tag to its own `torch.empty(handle bytes, dtype=uint8, pin_memory=True)`. A handle is a
segment of torch's CUDA caching allocator serving vLLM's memory pool (`cuda_segments`). torch's
pinned host allocator (CachingHostAllocator) rounds each copy up to the next power of two and keeps
the blocks cached when wake frees them, for the next sleep to take again: the pinned figure is held
from the first sleep on, awake or asleep (dagrl/backends/pinned.py packs our own buffers around
the same rounding).

The tag is open around the model runner's load_model (vllm/v1/worker/gpu_worker.py), so it holds
more than the weights (`weight_allocations`):
- the model in vLLM's layout: per layer the fused qkv_proj (its bias where the model has one), split
  over TP with the kv heads replicated below one a shard (QKVParallelLinear), o_proj, the fused
  gate_up_proj and down_proj (split), the two RMSNorms and Qwen3's q/k norms, and the attention's
  nine fp32 scalars (set_default_quant_scales); the embedding and lm_head unless tied, the
  vocabulary padded to 64 rows and split over TP (vocab_parallel_embedding.py); the final norm; the
  rotary cos/sin cache, one for all layers (max_position_embeddings x head_dim in the model's dtype);
- the V2 model runner's sampler and structured-output buffers, made in load_model and sized by
  max_num_seqs (v1/worker/gpu/sample/, v1/worker/gpu/structured_outputs.py): the penalties'
  output_bin_counts [max_num_seqs, vocab] int32 (0.58 GiB at 1024 x 151936, a 1 GiB pinned block)
  and prompt_bin_mask, the grammar bitmask, the logit-bias, bad-words and logprob-token-id tables.
The rotary cache's fp32 temporaries leave free segments that the sampler's tables take later (at the
Qwen3 shapes the segments add up the same with and without them), so they are left out. An adapter
served (enable_lora) adds its LoRA slots under the tag too: not counted (not measured).

Measured, vLLM 0.26.0's "of which X GiB is backed up in CPU" at sleep (H200, bf16, TP 1,
max_num_seqs 1024, random-weight Qwen3 shapes with max_position_embeddings 4096, 2026-11-28): the
8B shape 15.90 GiB (its weights 15.26), the 4B shape 8.19 (7.49); `backup_bytes` reads 15.90 and
8.19 (tests/backends/vllm/test_sleep_backup.py), and pins 21.97 and 11.10. The 8b-torch row (2 x
H200, 251 GiB host, trainer and engine in one process) read that process's RSS at 161.8 GiB,
steady from step 1, where the plan reads 159.29 (train 137.32 + rollout 21.97): the other 2.5 GiB
are the process's libraries and CUDA's host side, one measurement, not counted.
"""

from __future__ import annotations

import bisect
import functools

from dagrl.backends.memory import GIB
from dagrl.backends.model_shape import ModelShape, tensor_numels

# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp; c10/core/AllocatorConfig.h)
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to this
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to it share...
SMALL_SEGMENT = 2 << 20  # kSmallBuffer: ...segments of this size (the small pool)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests below it share...
LARGE_SEGMENT = 20 << 20  # kLargeBuffer: ...segments of this size; larger ones get their own,
ROUND_LARGE = 2 << 20  # kRoundLarge: rounded up to this

VOCAB_PADDING = 64  # vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
ATTENTION_SCALARS = 9  # fp32 scalars per attention layer (attention.py set_default_quant_scales)
# vLLM's max_num_seqs for the LLM class (vllm/engine/arg_utils.py get_batch_defaults): 1024 on
# cards of 70 GiB or more other than an A100 (the plan knows only the size: an A100 80 GB counts
# 1024: 0.81 GiB more pinned than its engine's 256 take at vocabulary 151936), 256 below
LARGE_CARD_MAX_NUM_SEQS, SMALL_CARD_MAX_NUM_SEQS = 1024, 256
LARGE_CARD_BYTES = 70 * GIB
# the sampler's per-request tables (v1/worker/gpu/sample/): logit_bias.py MAX_NUM_ALLOWED_TOKEN_IDS,
# MAX_NUM_LOGIT_BIAS_TOKENS (ids and biases), MAX_NUM_STOP_TOKEN_IDS; bad_words.py
# MAX_BAD_WORDS_TOTAL_TOKENS, MAX_NUM_BAD_WORDS + 1 offsets; sampling_params.py MAX_LOGPROB_TOKEN_IDS
SAMPLER_ROW_WIDTHS = (1024, 1024, 1024, 128, 1024, 129, 128)


def default_max_num_seqs(card_bytes: float) -> int:
    """vLLM's max_num_seqs when none is set, for a card of `card_bytes`."""
    return LARGE_CARD_MAX_NUM_SEQS if card_bytes >= LARGE_CARD_BYTES else SMALL_CARD_MAX_NUM_SEQS


def weight_allocations(shape: ModelShape, width: int, tp: int, max_num_seqs: int) -> list[tuple[str, int]]:
    """(name, bytes) of each allocation vLLM makes under its "weights" tag on one TP shard, in
    its order (module docstring): the model's, then the sampler's."""
    return [*_model_allocations(shape, width, tp), *_sampler_allocations(shape.vocab, max_num_seqs)]


def _model_allocations(shape: ModelShape, width: int, tp: int) -> list[tuple[str, int]]:
    """The model in vLLM's layout. Where tensor_numels cannot list the shape (MoE, other layouts),
    the attention, norms and ends are listed as for a dense model, the routed experts as vLLM's
    FusedMoE holds them (w13 and w2 per layer, 2/3 and 1/3 of the layer's experts, split over TP),
    and what is left of `shape.params` (router, shared experts, biases) as one tensor per layer,
    unsplit: above the shard at TP > 1, and one segment where there may be several."""
    numels = tensor_numels(shape)
    h, d, layers = shape.hidden, shape.head_dim, shape.layers
    kv_heads = max(1, shape.kv_heads // tp)  # replicated below one a shard
    qkv = (shape.heads // tp + 2 * kv_heads) * d
    vocab = _round_up(shape.vocab, VOCAB_PADDING) // tp
    if numels is not None:  # dense: its MLP fused, split; the qkv bias where tensor_numels counts one
        # a dense layer has 9 tensors (11 with q/k norms), 3 more with q/k/v biases
        qkv_bias = (len(numels) - 3 + shape.tied) // layers > 9 + 2 * shape.qk_norm
        mlp = [
            ("gate_up_proj", 2 * shape.intermediate // tp * h),
            ("down_proj", shape.intermediate // tp * h),
        ]
    else:
        qkv_bias = False
        ends = shape.vocab * h * (1 if shape.tied else 2) + h
        attention = h * (shape.q_dim + 2 * shape.kv_dim) + shape.q_dim * h + 2 * h + 2 * d * shape.qk_norm
        rest = max(0, shape.params - shape.expert_params - ends - layers * attention) // layers
        experts = shape.expert_params // layers // tp
        mlp = [("w13", 2 * experts // 3), ("w2", experts // 3), ("rest", rest)]
    out = [("embed_tokens", vocab * h * width)]
    for layer in range(layers):
        out += [("qkv_proj", h * qkv * width), *([("qkv_bias", qkv * width)] if qkv_bias else [])]
        out.append(("o_proj", shape.heads // tp * d * h * width))
        if layer == 0:
            out.append(("cos_sin_cache", shape.max_positions * d * width))
        out += [("attention_scalar", 4)] * ATTENTION_SCALARS
        out += [("q_norm", d * width), ("k_norm", d * width)] if shape.qk_norm else []
        out += [(name, n * width) for name, n in mlp if n]
        out += [("input_layernorm", h * width), ("post_attention_layernorm", h * width)]
    out.append(("norm", h * width))
    return out + ([] if shape.tied else [("lm_head", vocab * h * width)])


def _sampler_allocations(vocab: int, rows: int) -> list[tuple[str, int]]:
    """The V2 model runner's buffers made in load_model, int32 or fp32 (4 bytes) each: the
    logit-bias tables, the penalties' [rows, vocab / 32] prompt mask and [rows, vocab] output
    counts, the bad-words and logprob-token-id tables, the structured outputs' indices and
    [rows, vocab / 32] grammar bitmask (one logit per request without speculative decoding)."""
    words = -(-vocab // 32)
    allowed, bias_ids, bias, stop, bad, bad_offsets, logprob_ids = (4 * rows * w for w in SAMPLER_ROW_WIDTHS)
    return [
        ("allowed_token_ids", allowed),
        ("logit_bias_token_ids", bias_ids),
        ("logit_bias", bias),
        ("stop_token_ids", stop),
        ("prompt_bin_mask", 4 * rows * words),
        ("output_bin_counts", 4 * rows * vocab),
        ("bad_word_token_ids", bad),
        ("bad_word_offsets", bad_offsets),
        ("logprob_token_ids", logprob_ids),
        ("logits_indices", 4 * rows),
        ("grammar_bitmask", 4 * rows * words),
    ]


def cuda_segments(sizes: list[int]) -> list[int]:
    """The segments torch's CUDA caching allocator maps for requests of `sizes` bytes made in
    turn and none freed: each request rounded up to 512 bytes; one of at most 1 MiB from the small
    pool's 2 MiB segments, a larger one from the large pool: its own segment rounded up to 2 MiB
    from 10 MiB, else a shared 20 MiB one. A request takes the smallest free block of its pool
    that holds it (a new segment where none does) and leaves the rest free where that is at least
    512 bytes (small pool) or more than 1 MiB (large pool): a new segment's rest serves later
    requests; an empty request maps nothing."""
    segments: list[int] = []
    free: dict[bool, list[int]] = {True: [], False: []}  # small pool?, sorted free block bytes
    for size in filter(None, sizes):
        n = max(MIN_BLOCK, _round_up(size, MIN_BLOCK))
        small = n <= SMALL_SIZE
        blocks = free[small]
        i = bisect.bisect_left(blocks, n)
        if i < len(blocks):
            block = blocks.pop(i)
        else:
            block = _new_segment(n)
            segments.append(block)
        rest = block - n
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            bisect.insort(blocks, rest)
    return segments


@functools.lru_cache(maxsize=64)
def backup_bytes(shape: ModelShape, width: int, tp: int, max_num_seqs: int) -> tuple[int, int]:
    """(backed-up, pinned) bytes of one TP shard's engine asleep at level 1: its weight-tag
    segments, and the same each rounded up to a power of two (module docstring)."""
    segments = cuda_segments([n for _, n in weight_allocations(shape, width, tp, max_num_seqs)])
    return sum(segments), sum(1 << (s - 1).bit_length() for s in segments)


def _new_segment(n: int) -> int:
    """The bytes of the segment torch maps for a request of `n` bytes (rounded) that no free block holds."""
    if n <= SMALL_SIZE:
        return SMALL_SEGMENT
    return LARGE_SEGMENT if n < MIN_LARGE_ALLOC else _round_up(n, ROUND_LARGE)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
