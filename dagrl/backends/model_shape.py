"""A model's shape as the memory estimates need it, read from its config.json (nothing is loaded).

The backends' estimates (dagrl/backends/*/memory.py) are pure functions of this shape, the role's
spec and the workload of a phase; reading the shape is the only part that touches the disk.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the MLP's width (a routed expert's width times top-k for MoE models)
    vocab: int
    tied: bool  # input embedding and output layer share one matrix
    params: int  # every parameter, counted once when tied
    expert_params: int = 0  # those in routed experts (split over EP by megatron)
    qk_norm: bool = False  # RMSNorm on queries and keys (Qwen3): their inputs are kept too
    max_positions: int = 0  # max_position_embeddings (vLLM's rotary cache holds as many rows); 0: not read

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def tensor_numels(shape: ModelShape) -> list[int] | None:
    """The elements of each parameter tensor of a dense Qwen/Llama-style HF decoder of `shape`
    (embedding; per layer q/k/v/o, the q/k norms (Qwen3), gate/up/down, two norms; the final norm;
    the output layer unless tied), with q/k/v biases (Qwen2) when only they make up the count;
    None when the list does not add up to `shape.params` (MoE, other layouts): a caller then
    bounds what it needs with tensor_count_bound."""
    h, q, kv, i, d = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate, shape.head_dim
    layer = [h * q, h * kv, h * kv, q * h, *([d, d] if shape.qk_norm else []), h * i, h * i, i * h, h, h]
    ends = [shape.vocab * h, h, *([] if shape.tied else [shape.vocab * h])]
    for biases in ([], [q, kv, kv]):
        numels = ends[:1] + (layer + biases) * shape.layers + ends[1:]
        if sum(numels) == shape.params and not shape.expert_params:
            return numels
    return None


def tensor_count_bound(shape: ModelShape) -> int:
    """At least as many parameter tensors as an HF or megatron decoder of `shape` has on any of
    its devices, LoRA adapters included: 32 a layer (a dense layer has 7-13, adapters add 2 per
    adapted linear), 8 for the ends, and one per `hidden` elements of routed experts (each expert
    tensor holds at least hidden × its width)."""
    return 32 * shape.layers + 8 + shape.expert_params // shape.hidden


def shape_from_config(hf_cfg, params: int, expert_params: int = 0, qk_norm: bool = False) -> ModelShape:
    """The shape of a transformers config (Qwen/Llama-style keys); `params` counted elsewhere."""
    heads = hf_cfg.num_attention_heads
    head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // heads
    intermediate = hf_cfg.intermediate_size
    experts_per_token = getattr(hf_cfg, "num_experts_per_tok", None)
    if getattr(hf_cfg, "num_experts", None) and experts_per_token:  # MoE: the routed experts' width
        intermediate = getattr(hf_cfg, "moe_intermediate_size", intermediate) * experts_per_token
    return ModelShape(
        hidden=hf_cfg.hidden_size,
        layers=hf_cfg.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=hf_cfg.vocab_size,
        tied=bool(getattr(hf_cfg, "tie_word_embeddings", False)),
        params=params,
        expert_params=expert_params,
        qk_norm=qk_norm,
        max_positions=getattr(hf_cfg, "max_position_embeddings", None) or 0,
    )


def read_model_shape(path: str, trust_remote_code: bool = False) -> ModelShape:
    """The shape of the model directory (or hub id) `path`; parameters counted on the meta device.
    Read once per directory and version of its config.json: the memory plan asks at each of its
    automatic choices, and building the meta model takes ~0.1 s at 28 layers."""
    config = os.path.join(os.path.expanduser(path), "config.json")
    info = os.stat(config) if os.path.isfile(config) else None
    stamp = (info.st_mtime_ns, info.st_size) if info is not None else None
    return _read_shape(path, trust_remote_code, stamp)


@functools.lru_cache(maxsize=64)
def _read_shape(path: str, trust_remote_code: bool, stamp: tuple[int, int] | None) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        named = list(AutoModelForCausalLM.from_config(hf_cfg).named_parameters())
    experts = sum(p.numel() for name, p in named if ".experts." in name)
    qk_norm = any(name.endswith(("q_norm.weight", "q_layernorm.weight")) for name, _ in named)
    return shape_from_config(hf_cfg, sum(p.numel() for _, p in named), experts, qk_norm)
