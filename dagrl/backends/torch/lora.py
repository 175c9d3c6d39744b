"""LoRA for the torch backend: a feature applied to the model when it is built (PEFT), the
trainer unchanged.

`apply_lora` wraps the HF model with PEFT's LoRA layers on the spec's target modules. The base
stays in its compute dtype with requires_grad off (no gradient, no fp32 master, no Adam state:
`MasterWeightsAdamW` takes the trainable parameters only); PEFT creates the adapters in fp32
(`autocast_adapter_dtype`), so they train in full precision without a master copy.

What leaves the backend:
- `merged_weights`: every base tensor under the base model's own names (never PEFT's
  `base_layer`), the adapted layers' weights with scale · B·A added as PEFT's merge adds it, so
  any engine loads them as a full sync; the module itself is not merged (a merge and unmerge in
  bf16 would not give the weights back bit for bit).
- `adapter_weights`: the adapter tensors only, named as PEFT saves them
  (`base_model.model.<module>.lora_A.weight`), which is the form vLLM's LoRA loader parses.
- the reference model of KL is the same module with the adapter disabled (`base_only`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from dagrl.config.roles import ALL_LINEAR, LoraSettings

ADAPTER = "default"  # PEFT's name of the one adapter


def peft_config(lora: LoraSettings):
    """PEFT's LoraConfig of the role's LoRA settings."""
    from peft import LoraConfig

    targets = lora.target_modules
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=lora.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """The last name part of every linear layer LoRA can adapt (`q_proj`, `down_proj`, ...); the
    output layer is left out, as PEFT's `all-linear` leaves it out."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }
    return sorted(names)


def model_linear_names(path: str, trust_remote_code: bool = False) -> list[str]:
    """`linear_layer_names` of the model at `path`, built on the meta device from its config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg, trust_remote_code=trust_remote_code)
    return linear_layer_names(model)


def unknown_targets(targets: tuple[str, ...] | str, names: list[str]) -> list[str]:
    """The target module names that are not linear layers of the model (`all-linear` is none)."""
    if targets == ALL_LINEAR:
        return []
    return [t for t in targets if t not in names]


def apply_lora(model: torch.nn.Module, lora: LoraSettings) -> torch.nn.Module:
    """The model with LoRA adapters on `lora.target_modules`; base frozen in its dtype, adapters
    fp32 (B starts at zero, so the first forward is the base model's)."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, peft_config(lora), autocast_adapter_dtype=True)
    for name, param in peft_model.named_parameters():
        assert param.requires_grad == ("lora_" in name), f"{name}: only adapters train"
    return peft_model


def adapted_layers(peft_model) -> dict[str, torch.nn.Module]:
    """The base model's module name (as transformers names it) -> its LoRA layer."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


def _merged(layer, weight: torch.Tensor) -> torch.Tensor:
    """weight + scale · B·A in the weight's dtype, the arithmetic of PEFT's merge."""
    delta = layer.get_delta_weight(ADAPTER)
    return (weight.to(delta.dtype) + delta).to(weight.dtype)


@torch.no_grad()
def merged_weights(peft_model) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, tensor) of the whole model with the adapters folded in: what a full sync or a
    merged HF export carries. Adapter tensors stay out; `x.base_layer.weight` becomes `x.weight`."""
    layers = adapted_layers(peft_model)
    for name, tensor in peft_model.get_base_model().state_dict().items():
        if "lora_" in name:
            continue
        module, _, leaf = name.rpartition(".")
        if module.endswith(".base_layer"):
            module = module.removesuffix(".base_layer")
            name = f"{module}.{leaf}"
            if leaf == "weight":
                tensor = _merged(layers[module], tensor)
        yield name, tensor


def adapter_weights(peft_model) -> dict[str, torch.Tensor]:
    """The adapter tensors under PEFT's saved names (`...q_proj.lora_A.weight`)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(peft_model, adapter_name=ADAPTER)


def load_adapter_weights(peft_model, state: dict[str, torch.Tensor]) -> None:
    """Adapter tensors as `adapter_weights` gives them, into the model; every adapter must be there."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if "lora_" in k]
    assert not missing and not result.unexpected_keys, f"adapter mismatch: {missing} {result.unexpected_keys}"


def base_only(peft_model):
    """A context in which the model is the base (adapters off): the reference of KL."""
    return peft_model.disable_adapter() if peft_model is not None else contextlib.nullcontext()


def adapter_params(shape, lora: LoraSettings) -> int:
    """Adapter parameters of a decoder of `shape` (Qwen/Llama linear layer names): r·(in + out)
    per adapted layer."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    dims = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    targets = list(dims) if lora.target_modules == ALL_LINEAR else lora.target_modules
    per_layer = sum(sum(dims[t]) for t in targets if t in dims)
    return lora.rank * per_layer * shape.layers


def save_merged(peft_model, path: str) -> None:
    """`path`: a HF model of the merged weights (loads with transformers alone); `path/adapter`:
    the PEFT adapter directory (loads with peft on the base at model.path)."""
    import os

    merged = dict(merged_weights(peft_model))
    peft_model.get_base_model().save_pretrained(path, state_dict=merged, safe_serialization=True)
    peft_model.save_pretrained(os.path.join(path, "adapter"), safe_serialization=True)
