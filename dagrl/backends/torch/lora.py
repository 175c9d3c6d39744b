"""LoRA for the torch backend: a feature applied to the model when it is built (PEFT), the
trainer unchanged.

`apply_lora` wraps the HF model with PEFT's LoRA layers on the spec's target modules. The base
stays in its compute dtype with requires_grad off (no gradient, no fp32 master, no Adam state:
`MasterWeightsAdamW` takes the trainable parameters only). The adapters are held in the compute
dtype too, and trained as every bf16 weight of a full-parameter run is: fp32 masters and Adam
state in `MasterWeightsAdamW`, the rounded result in the model. fp32 adapters in a bf16 model
(PEFT's `autocast_adapter_dtype`) cost the update more than the base's frozen weights save: PEFT's
`Linear.forward` casts each adapted layer's input to fp32 (q, k and v each cast the same input),
runs both adapter matmuls in fp32 and adds their fp32 result to the bf16 base output, which makes
an fp32 copy of every adapted layer's output; the recompute and the backward repeat it. On an H100
(Qwen3-0.6B shape, rank 64, all-linear) that update took 4.27 s where full-parameter took 2.39 s.

What leaves the backend:
- `merged_weights`: every base tensor under the base model's own names (never PEFT's
  `base_layer`), the adapted layers' weights with scale · B·A added (computed in fp32, rounded
  once into the weight's dtype), so any engine loads them as a full sync; the module itself is
  not merged (a merge and unmerge in bf16 would not give the weights back bit for bit).
- `adapter_weights`: the adapter tensors only, named as PEFT saves them
  (`base_model.model.<module>.lora_A.weight`), which is the form vLLM's LoRA loader parses.
- the reference model of KL is the same module with the adapter disabled (`base_only`).
The first two take the adapters the forward runs (the weight sync: what the trainer's policy is,
as a full-parameter sync sends the compute weights) or, given `masters`, the optimizer's fp32
masters (checkpoints and the HF export: the adapters as trained, not their rounding).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from dagrl.config.roles import ALL_LINEAR, LoraSettings

ADAPTER = "default"  # PEFT's name of the one adapter
Masters = Mapping[torch.Tensor, torch.Tensor]  # a trained parameter -> its fp32 master


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
    """The model with LoRA adapters on `lora.target_modules`, base frozen, adapters in the base's
    dtype (drawn in fp32 by PEFT, then rounded; B starts at zero, so the first forward is the base
    model's). The optimizer keeps their fp32 masters (mixed_precision.py)."""
    from peft import get_peft_model

    dtype = next(model.parameters()).dtype
    peft_model = get_peft_model(model, peft_config(lora), autocast_adapter_dtype=True)
    for name, param in peft_model.named_parameters():
        assert param.requires_grad == ("lora_" in name), f"{name}: only adapters train"
        if param.requires_grad:
            param.data = param.data.to(dtype)
    return peft_model


def adapted_layers(peft_model) -> dict[str, torch.nn.Module]:
    """The base model's module name (as transformers names it) -> its LoRA layer."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


def _pick(param: torch.Tensor, masters: Masters | None) -> torch.Tensor:
    return param if masters is None else masters.get(param, param)


def _merged(layer, weight: torch.Tensor, masters: Masters | None) -> torch.Tensor:
    """weight + scale · B·A computed in fp32 and rounded once into the weight's dtype (with fp32
    weights and adapters, exactly the arithmetic of PEFT's merge)."""
    assert not layer.fan_in_fan_out, "transformers' Linear layers store [out, in]"
    a = _pick(layer.lora_A[ADAPTER].weight, masters).to(weight.device, torch.float32)
    b = _pick(layer.lora_B[ADAPTER].weight, masters).to(weight.device, torch.float32)
    merged = (b @ a).mul_(layer.scaling[ADAPTER]).add_(weight)  # one fp32 [out, in] alive
    return merged.to(weight.dtype)


@torch.no_grad()
def merged_weights(peft_model, masters: Masters | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, tensor) of the whole model with the adapters folded in: what a full sync or a
    merged HF export carries. Adapter tensors stay out; `x.base_layer.weight` becomes `x.weight`.
    `masters`: fold in the fp32 masters instead of the compute-dtype adapters."""
    layers = adapted_layers(peft_model)
    for name, tensor in peft_model.get_base_model().state_dict().items():
        if "lora_" in name:
            continue
        module, _, leaf = name.rpartition(".")
        if module.endswith(".base_layer"):
            module = module.removesuffix(".base_layer")
            name = f"{module}.{leaf}"
            if leaf == "weight":
                tensor = _merged(layers[module], tensor, masters)
        yield name, tensor


def _adapter_state(peft_model, masters: Masters | None) -> dict[str, torch.Tensor] | None:
    """The model's adapter tensors under its own parameter names, the fp32 masters in their
    place; None (PEFT reads the model) without masters."""
    if masters is None:
        return None
    return {n: _pick(p, masters) for n, p in peft_model.named_parameters() if "lora_" in n}


def adapter_weights(peft_model, masters: Masters | None = None) -> dict[str, torch.Tensor]:
    """The adapter tensors under PEFT's saved names (`...q_proj.lora_A.weight`); with `masters`
    their fp32 masters."""
    from peft import get_peft_model_state_dict

    state = _adapter_state(peft_model, masters)
    return get_peft_model_state_dict(peft_model, state_dict=state, adapter_name=ADAPTER)


def save_adapter(peft_model, path: str, masters: Masters | None = None) -> None:
    """The PEFT adapter directory at `path` (adapter_model.safetensors, adapter_config.json)."""
    state = _adapter_state(peft_model, masters)
    peft_model.save_pretrained(path, safe_serialization=True, state_dict=state)


def load_adapter_weights(peft_model, state: dict[str, torch.Tensor]) -> None:
    """Adapter tensors as `adapter_weights` gives them, into the model (fp32 masters are rounded
    into the compute dtype, which gives the adapters they were rounded into when saved); every
    adapter must be there."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if "lora_" in k]
    assert not missing and not result.unexpected_keys, f"adapter mismatch: {missing} {result.unexpected_keys}"


def base_only(peft_model):
    """A context in which the model is the base (adapters off): the reference of KL."""
    return peft_model.disable_adapter() if peft_model is not None else contextlib.nullcontext()


def _adapted_dims(shape, lora: LoraSettings) -> list[tuple[int, int]]:
    """(in, out) of each adapted layer of one decoder layer of `shape` (Qwen/Llama names)."""
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
    return [dims[t] for t in targets if t in dims]


def adapter_params(shape, lora: LoraSettings) -> int:
    """Adapter parameters of a decoder of `shape`: r·(in + out) per adapted layer."""
    return lora.rank * sum(i + o for i, o in _adapted_dims(shape, lora)) * shape.layers


def adapter_numels(shape, lora: LoraSettings) -> list[int]:
    """Elements of each adapter tensor (A: r × in, B: out × r per adapted layer, every layer)."""
    return [lora.rank * n for i, o in _adapted_dims(shape, lora) for n in (i, o)] * shape.layers


def merged_sync_bytes(shape, lora: LoraSettings, width: int, bucket_bytes: float) -> float:
    """What a merged sync allocates besides the model: the adapted weights it makes (`width` bytes
    each; the base's other tensors go as they are), one bucket of them alive at a time, and one
    layer's fp32 B·A being folded in (`_merged`)."""
    dims = _adapted_dims(shape, lora)
    made = sum(i * o for i, o in dims) * shape.layers * width
    return float(min(made, bucket_bytes) + 4 * max((i * o for i, o in dims), default=0))


def save_merged(peft_model, path: str, masters: Masters | None = None) -> None:
    """`path`: a HF model of the merged weights (loads with transformers alone); `path/adapter`:
    the PEFT adapter directory (loads with peft on the base at model.path). With `masters` both
    come from the fp32 masters: the adapters in fp32, the merge rounded once."""
    import os

    merged = dict(merged_weights(peft_model, masters))
    peft_model.get_base_model().save_pretrained(path, state_dict=merged, safe_serialization=True)
    save_adapter(peft_model, os.path.join(path, "adapter"), masters)
