"""Model FLOPs of a transformer pass, from its shape: the throughput metrics every train backend
can report (tokens/s and model TFLOP/s per GPU of a phase), as PaLM's appendix B counts them.

Pure: the shape (dagrl/backends/model_shape.py) and the token ids run through the model in, the
figures out. Only the matmuls and causal attention count (the embedding lookup, norms and
activations are a few percent); a backward pass costs two forwards, so an update is 3 passes.
"""

from __future__ import annotations

from dagrl.backends.model_shape import ModelShape


def forward_flops_per_token(shape: ModelShape, seq: float, gated_mlp: bool = True) -> float:
    """FLOPs of one forward per token at mean sequence length `seq`: 2 x the matmul parameters
    (attention projections, the MLP's 3 matrices when gated else 2, the output layer) plus causal
    attention's 2 x layers x seq x heads x head_dim (scores and weighted sum, half the square each)."""
    h, q, kv = shape.hidden, shape.q_dim, shape.kv_dim
    mlp = (3 if gated_mlp else 2) * h * shape.intermediate
    per_layer = h * (q + 2 * kv) + q * h + mlp
    matmul = shape.layers * per_layer + h * shape.vocab
    return 2 * matmul + 2 * shape.layers * seq * q


def throughput_metrics(
    shape: ModelShape,
    phase: str,
    input_ids: list,
    seconds: float,
    passes: int,
    gpus: int,
    gated_mlp: bool = True,
) -> dict[str, float]:
    """perf/{phase}_s, _tokens_per_s (this DP shard's tokens, padding included) and
    _tflops_per_gpu over the micro-batches' `input_ids` [B, S] run `passes` forward-equivalents
    (fwd+bwd = 3) on `gpus` model-parallel GPUs."""
    tokens = sum(ids.numel() for ids in input_ids)
    seq = sum(ids.numel() * ids.shape[1] for ids in input_ids) / max(tokens, 1)
    flops = passes * tokens * forward_flops_per_token(shape, seq, gated_mlp)
    return {
        f"perf/{phase}_s": seconds,
        f"perf/{phase}_tokens_per_s": tokens / seconds,
        f"perf/{phase}_tflops_per_gpu": flops / gpus / seconds / 1e12,
    }
