"""The output layer of a HF causal LM, for the distillation passes of both train backends.

- ``output_layer``: a loaded model's output layer (weight ``[V, H]``, bias or None);
- ``load_output_layer``: a frozen model's output layer alone, read from its checkpoint (the
  student recomputes the teacher's logits from the teacher's hidden states with it).

Only plain linear output layers are supported (logits = hidden @ W.T + b): models that rescale or
soft-cap logits after the head (Gemma 2's ``final_logit_softcapping``, Cohere's ``logit_scale``)
are refused by ``output_layer``.
"""

from __future__ import annotations

import torch
from torch import Tensor

_POST_HEAD_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
)


def output_layer(model: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """The output layer's weight ``[V, H]`` and bias ``[V]`` (or None) of a HF causal LM."""
    config = model.config
    for name in _POST_HEAD_TRANSFORMS:
        value = getattr(config, name, None)
        assert value in (None, 1, 1.0), (
            f"{type(model).__name__} transforms logits after the head ({name}={value})"
        )
    head = model.get_output_embeddings()
    return head.weight, head.bias


def load_output_layer(path: str, trust_remote_code: bool = False) -> tuple[Tensor, Tensor | None]:
    """The output layer (weight ``[V, H]``, bias or None) of the HF causal LM at ``path``, read from
    its safetensors without building the model: its tensor names come from the architecture built
    on the meta device (the input embedding's when the two are tied)."""
    import json
    import os

    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    output_layer(model)  # refuses post-head logit transforms
    names = {id(m): n for n, m in model.named_modules()}
    head = model.get_output_embeddings()
    prefix = names[id(head)]
    if getattr(config, "tie_word_embeddings", False):
        prefix = names[id(model.get_input_embeddings())]
    wanted = {f"{prefix}.weight"} | ({f"{prefix}.bias"} if head.bias is not None else set())
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted({json.load(f)["weight_map"][name] for name in wanted})
    else:
        files = ["model.safetensors"]
    found: dict[str, Tensor] = {}
    for file in files:
        with safe_open(os.path.join(path, file), framework="pt") as f:
            found.update({name: f.get_tensor(name) for name in wanted if name in f.keys()})
    assert wanted <= found.keys(), f"{path}: output layer tensors {sorted(wanted - found.keys())} not found"
    return found[f"{prefix}.weight"], found.get(f"{prefix}.bias")
