"""tensor_numels lists the HF model's own parameter tensors (what the pinned host buffers are
packed for), or None where it cannot (then the plans use tensor_count_bound)."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.model_shape import shape_from_config, tensor_count_bound, tensor_numels


def _meta_numels(hf_cfg) -> tuple[list[int], bool]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        named = list(AutoModelForCausalLM.from_config(hf_cfg).named_parameters())
    qk_norm = any(name.endswith("q_norm.weight") for name, _ in named)
    return [p.numel() for _, p in named], qk_norm


def _configs():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    small = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    return {
        "qwen3-tied": Qwen3Config(
            **small, head_dim=32, intermediate_size=96, vocab_size=300, tie_word_embeddings=True
        ),
        "qwen3": Qwen3Config(
            **small, head_dim=16, intermediate_size=96, vocab_size=300, tie_word_embeddings=False
        ),
        "qwen2-biases": Qwen2Config(**small, intermediate_size=96, vocab_size=300, tie_word_embeddings=False),
        "llama": LlamaConfig(**small, intermediate_size=96, vocab_size=300),
    }


@pytest.mark.parametrize("name", ["qwen3-tied", "qwen3", "qwen2-biases", "llama"])
def test_the_listed_tensors_are_the_models(name):
    hf_cfg = _configs()[name]
    numels, qk_norm = _meta_numels(hf_cfg)
    shape = shape_from_config(hf_cfg, sum(numels), qk_norm=qk_norm)
    assert sorted(tensor_numels(shape)) == sorted(numels)
    assert tensor_count_bound(shape) >= len(numels)


def test_a_moe_model_is_not_listed_but_bounded():
    from transformers import Qwen3MoeConfig

    hf_cfg = Qwen3MoeConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, vocab_size=300,
    )  # fmt: skip
    numels, qk_norm = _meta_numels(hf_cfg)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        named = AutoModelForCausalLM.from_config(hf_cfg).named_parameters()
        experts = sum(p.numel() for n, p in named if ".experts." in n)
    shape = shape_from_config(hf_cfg, sum(numels), experts, qk_norm)
    assert tensor_numels(shape) is None
    assert tensor_count_bound(shape) >= len(numels)
