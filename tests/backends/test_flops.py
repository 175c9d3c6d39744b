"""The model FLOPs count of dagrl/backends/flops.py against a hand count on a tiny shape."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.flops import forward_flops_per_token, throughput_metrics
from dagrl.backends.model_shape import ModelShape

# hidden 4, 2 layers, 2 query heads and 1 KV head of width 2, gated MLP of width 8, vocabulary 10
SHAPE = ModelShape(
    hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10, tied=False, params=0
)


def test_forward_flops_per_token_by_hand():
    # per layer: q, k, v 4 x (4 + 2 + 2) = 32, o 4 x 4 = 16, MLP 3 x 4 x 8 = 96 -> 144; two layers and
    # the output layer 4 x 10: 328 parameters in matmuls, 2 FLOPs each = 656; attention at seq 3:
    # 2 x 2 layers x 3 x 4 = 48
    assert forward_flops_per_token(SHAPE, seq=3) == 704
    # an ungated MLP has two matrices: 2 x 4 x 8 = 64 per layer, 64 fewer matmul parameters in all
    assert forward_flops_per_token(SHAPE, seq=3, gated_mlp=False) == 704 - 2 * 64


def test_throughput_metrics_of_an_update():
    ids = [torch.zeros(2, 3, dtype=torch.long)]  # 6 tokens at length 3, fwd + bwd = 3 passes
    out = throughput_metrics(SHAPE, "update", ids, seconds=2.0, passes=3, gpus=2)
    assert out["perf/update_s"] == 2.0 and out["perf/update_tokens_per_s"] == 3.0
    assert out["perf/update_tflops_per_gpu"] == pytest.approx(3 * 6 * 704 / 2 / 2 / 1e12)
