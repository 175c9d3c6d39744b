"""Config-only Qwen3 shapes for the dry-run plan tests (a config.json and the tokenizer, no
weights: the plan reads the shape only)."""

from __future__ import annotations

import pytest

from tools.random_qwen3 import build_random_qwen3


def qwen3_dir(path, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab) -> str:
    return build_random_qwen3(
        str(path),
        hidden,
        layers,
        heads,
        kv_heads,
        intermediate,
        vocab,
        head_dim=head_dim,
        config_only=True,
        tied=True,
    )


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory) -> str:
    return qwen3_dir(tmp_path_factory.mktemp("q4b"), 2560, 36, 32, 8, 128, 9728, 151936)
