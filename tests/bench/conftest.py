"""Fixtures of the bench/ tests."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))


@pytest.fixture(scope="session")
def real_size_shapes(tmp_path_factory) -> dict[str, str]:
    """shape -> a config-only Qwen3 directory of bench/real_size_gpu.py's SHAPES (config.json and the
    shipped tokenizer, no weights: a dry run reads none)."""
    from real_size_gpu import SHAPES

    from tools.random_qwen3 import build_random_qwen3

    root = tmp_path_factory.mktemp("shapes")
    return {
        shape: build_random_qwen3(str(root / shape), *dims, 151936, head_dim=128, config_only=True)
        for shape, dims in SHAPES.items()
    }
