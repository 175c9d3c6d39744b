"""Tiny HF models built in code for the CPU tests (random weights, seeded): one place for the
shape, each test naming only what it needs of it."""

from __future__ import annotations

import torch


def tiny_qwen2(seed: int = 0, vocab: int = 48, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
               tie: bool = False, max_positions: int = 64):  # fmt: skip
    """A two-layer Qwen2ForCausalLM (intermediate size twice the hidden one), in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()
