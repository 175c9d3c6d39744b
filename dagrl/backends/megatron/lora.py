"""LoRA on the megatron backend: adapters on megatron's own linear layers, applied to the model
after its weights are loaded and before DDP and the optimizer wrap it; the trainer is unchanged.

Where the adapters go: the HF names PEFT targets map onto megatron's fused layers

    q_proj, k_proj, v_proj -> self_attention.linear_qkv   (column-parallel, fused QKV rows)
    o_proj                 -> self_attention.linear_proj  (row-parallel)
    gate_proj, up_proj     -> mlp.linear_fc1              (column-parallel, fused gate/up rows)
    down_proj              -> mlp.linear_fc2              (row-parallel)

A fused layer gets one adapter (A: r x in, B: out x r), so its HF names come together: q, k
and v share A and split B's rows (weights.py's fused layout), which is exactly three PEFT
adapters of rank r with the same A. That is how the adapter leaves for vLLM and the PEFT
directory: `..q_proj.lora_A` = `..k_proj.lora_A` = `..v_proj.lora_A` = A, `..q_proj.lora_B` = B's
q rows. A part of a fused group (`[q_proj, v_proj]`) masks the other names' rows of B: they stay
zero with a zero gradient (Adam leaves them there) and are not exported.

TP: an adapter is sharded like its layer's weight. Column-parallel (weight rows split): A is
replicated, B's rows split; the branch's input gradient is summed over TP like the layer's own
(copy_to_tensor_model_parallel_region; under sequence parallelism the r-wide activation is
all-gathered instead of the H-wide input). Row-parallel (weight columns split): A's columns
split, its partial products all-reduced (reduce-scattered over the sequence under SP), B
replicated. Replicated adapters whose gradient is a per-sequence-slice partial sum under SP carry
`sequence_parallel`, so megatron's finalize_model_grads all-reduces them as it does the norms.
A's full matrix is drawn from a generator seeded by (seed, layer, name), so every TP layout starts
from the same adapters.

The base: every base parameter has requires_grad off before DDP is built, so DDP gives it no
gradient buffer and the optimizer neither an fp32 main copy nor Adam state. The adapters are
parameters in the layer's dtype, trained as megatron trains every bf16 parameter: fp32 main
gradients, fp32 main params and Adam state in its optimizer, the result rounded into the
adapter. The branch then runs in the layer's dtype on its input; fp32 adapters (PEFT's
autocast_adapter_dtype, this module's choice until 2026-11-27) cast every adapted layer's input
to fp32, multiplied in fp32 and added an fp32 result to the bf16 output, which cost the torch
backend's LoRA update 1.8x its full-parameter one on an H100 (docs/lora.md). The merged weight
adds scale · B·A computed in fp32. `enabled=False` turns every adapter off: the base, which is
the reference of KL (no second copy of the model).
"""

from __future__ import annotations

import contextlib
import math
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dagrl.config.roles import ALL_LINEAR, LoraSettings

# megatron layer -> (its HF names in fused order, HF module path, column-parallel)
FUSED_LAYERS: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "linear_qkv": (("q_proj", "k_proj", "v_proj"), "self_attn", True),
    "linear_proj": (("o_proj",), "self_attn", False),
    "linear_fc1": (("gate_proj", "up_proj"), "mlp", True),
    "linear_fc2": (("down_proj",), "mlp", False),
}
_FUSES = {
    "linear_qkv": "qkv",
    "linear_fc1": "gate_up",
    "linear_proj": "none",
    "linear_fc2": "none",
}  # weights._Fuse
HF_LINEAR_NAMES = sorted(n for names, _, _ in FUSED_LAYERS.values() for n in names)
_LAYER_PATH = re.compile(r"^decoder\.layers\.(\d+)\.(self_attention|mlp)\.(linear_\w+)$")
PEFT_PREFIX = "base_model.model.model.layers"  # PEFT's saved name of a decoder layer


def target_layers(targets: tuple[str, ...] | str) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """({megatron layer: its HF names that `target_modules` names, in fused order}, the names that
    are no linear layer of the decoder)."""
    if targets == ALL_LINEAR:
        return {layer: names for layer, (names, _, _) in FUSED_LAYERS.items()}, ()
    named = set(targets)
    unknown = tuple(t for t in targets if t not in HF_LINEAR_NAMES)
    layers = {layer: tuple(n for n in names if n in named) for layer, (names, _, _) in FUSED_LAYERS.items()}
    return {layer: names for layer, names in layers.items() if names}, unknown


def hf_target_names(targets: tuple[str, ...] | str) -> list[str]:
    """The HF module names the adapters cover (what the PEFT directory lists)."""
    layers, _ = target_layers(targets)
    return [n for names in layers.values() for n in names]


def _row_mask(rows: int, kind: str, targeted: tuple[str, ...], tcfg) -> torch.Tensor | None:
    """[rows, 1]: 1 on the local rows of B that belong to a targeted HF name of a fused layer,
    0 on the others (q_proj and v_proj named, k_proj not: k's rows stay zero and untrained);
    None when the whole layer is targeted."""
    from dagrl.backends.megatron.weights import _Fuse, _unfuse

    names = FUSED_LAYERS[kind][0]
    if targeted == names:
        return None
    mask = torch.zeros(rows, 1)
    for name, index in zip(names, _unfuse(torch.arange(rows), _Fuse(_FUSES[kind]), tcfg)):
        if name in targeted:
            mask[index] = 1.0
    return mask


class LoraAdapter(torch.nn.Module):
    """The low-rank branch of one megatron linear layer: scale · B(A(dropout(x))), TP-sharded
    like the layer (module docstring). Shapes are this rank's: column-parallel A [r, in],
    B [out/tp, r]; row-parallel A [r, in/tp], B [out, r]."""

    def __init__(
        self,
        weight: torch.Tensor,
        lora: LoraSettings,
        column: bool,
        sequence_parallel: bool,
        row_mask: torch.Tensor | None = None,
    ):
        super().__init__()
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        out_local, in_local = weight.shape
        self.column, self.sequence_parallel = column, sequence_parallel
        self.scale = lora.alpha / lora.rank
        self.dropout_p = lora.dropout
        self.enabled = True
        self.tp_group = ps.get_tensor_model_parallel_group()
        dev, dtype = weight.device, weight.dtype  # the layer's: its optimizer keeps fp32 mains
        self.A = torch.nn.Parameter(torch.empty(lora.rank, in_local, dtype=dtype, device=dev))
        self.B = torch.nn.Parameter(torch.zeros(out_local, lora.rank, dtype=dtype, device=dev))
        split = self.B if column else self.A  # the tensor split over TP like the layer's weight
        set_tensor_model_parallel_attributes(split, True, 0 if column else 1, 1)
        replicated = self.A if column else self.B
        replicated.sequence_parallel = sequence_parallel  # its grad: a partial sum per sequence slice
        # rows of B outside the target (part of a fused layer): held at zero, their gradient zero
        mask = None if row_mask is None else row_mask.to(dev, dtype)  # B's dtype: no promotion
        self.register_buffer("row_mask", mask, persistent=False)

    @torch.no_grad()
    def reset(self, seed: int) -> None:
        """A as PEFT draws it (kaiming-uniform, bound 1/sqrt(fan_in)) from the full matrix every
        TP rank draws alike (in fp32, then rounded into A's dtype); B zero, so the adapted layer
        starts as the base."""
        from megatron.core import parallel_state as ps

        rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        fan_in = self.A.shape[1] * (1 if self.column else size)
        gen = torch.Generator().manual_seed(seed)
        full = (torch.rand(self.A.shape[0], fan_in, generator=gen, dtype=torch.float32) * 2 - 1) / math.sqrt(
            fan_in
        )
        local = full if self.column else full.chunk(size, dim=1)[rank]
        self.A.copy_(local)
        self.B.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core import tensor_parallel as tpl

        x = self._dropout(x.to(self.A.dtype))
        h = F.linear(x, self.A)  # [s, b, r]: partial sums over the input shards when row-parallel
        if self.column and self.sequence_parallel:
            h = tpl.gather_from_sequence_parallel_region(h, group=self.tp_group)
        elif self.column:
            h = tpl.copy_to_tensor_model_parallel_region(h, group=self.tp_group)
        elif self.sequence_parallel:
            h = tpl.reduce_scatter_to_sequence_parallel_region(h, group=self.tp_group)
        else:
            h = tpl.reduce_from_tensor_model_parallel_region(h, group=self.tp_group)
        return F.linear(h, self._b()) * self.scale

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core import tensor_parallel as tpl

        if self.dropout_p == 0 or not self.training:
            return x
        if self.column and not self.sequence_parallel:  # x is the same on every TP rank: so is its mask
            return F.dropout(x, self.dropout_p)
        with tpl.get_cuda_rng_tracker().fork():  # x is this rank's slice (input or sequence): its own mask
            return F.dropout(x, self.dropout_p)

    def _b(self) -> torch.Tensor:
        return self.B if self.row_mask is None else self.B * self.row_mask

    def delta(self) -> torch.Tensor:
        """scale · B·A of this rank's shard, shaped like the layer's local weight, in fp32."""
        return (self._b().float() @ self.A.float()) * self.scale


@dataclass
class AdaptedLayer:
    """One adapted megatron linear layer and where it sits in the HF model."""

    module: torch.nn.Module  # the megatron linear layer; its adapter is `module.lora`
    layer: int  # global decoder layer index
    kind: str  # a FUSED_LAYERS key
    targeted: tuple[str, ...]  # its HF names that carry the adapter (all of them but for a part of a group)

    @property
    def adapter(self) -> LoraAdapter:
        return self.module.lora


def apply_lora(chunks: list, lora: LoraSettings, seed: int, sequence_parallel: bool) -> list[AdaptedLayer]:
    """Freeze every parameter of `chunks`, put an adapter (in the layer's dtype) on each targeted linear layer
    (in place) and return them; the model's output equals the base's until B moves."""
    layers, unknown = target_layers(lora.target_modules)
    assert not unknown, f"megatron/lora_rules.py lets no unknown target through: {unknown}"
    adapted = []
    for chunk in chunks:
        chunk.requires_grad_(False)
        for name, module in chunk.named_modules():
            match = _LAYER_PATH.match(name)
            if match is None or match.group(3) not in layers:
                continue
            layer = chunk.decoder.layers[int(match.group(1))].layer_number - 1  # global, 0-based
            kind = match.group(3)
            mask = _row_mask(module.weight.shape[0], kind, layers[kind], chunk.config)
            module.lora = LoraAdapter(module.weight, lora, FUSED_LAYERS[kind][2], sequence_parallel, mask)
            module.lora.reset(zlib.crc32(f"{seed}.{layer}.{kind}".encode()))
            module.register_forward_hook(_add_adapter, with_kwargs=True)
            gated = kind == "linear_fc1" and chunk.config.gated_linear_unit
            module.sharded_state_dict = _adapter_sharded_state(module, module.sharded_state_dict, gated)
            adapted.append(AdaptedLayer(module, layer, kind, layers[kind]))
        # a frozen embedding makes no activation require a gradient, and a recomputed (checkpointed)
        # layer whose inputs need none would give its adapters none
        chunk.embedding.register_forward_hook(lambda _m, _a, out: out.requires_grad_(True))
    assert adapted, f"no layer of the model matched {lora.target_modules}"
    return adapted


def _add_adapter(module, args, kwargs, output):
    """The layer's (output, bias) with the adapter branch added (nothing when disabled)."""
    adapter = module.lora
    if not adapter.enabled:
        return None
    x = args[0] if args else next(iter(kwargs.values()))
    if hasattr(module, "layer_norm_weight"):  # TE fuses the layer's input norm into the linear
        x = _input_norm(module, x)
    out, bias = output
    return out + adapter(x).to(out.dtype), bias


def _input_norm(module, x: torch.Tensor) -> torch.Tensor:
    """The norm a TE LayerNorm-linear applies to its input (the adapter sees what the base sees)."""
    cfg = module.config
    weight = module.layer_norm_weight + (1 if cfg.layernorm_zero_centered_gamma else 0)
    if cfg.normalization == "RMSNorm":
        return F.rms_norm(x, (x.shape[-1],), weight, cfg.layernorm_epsilon)
    bias = getattr(module, "layer_norm_bias", None)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, cfg.layernorm_epsilon)


def _adapter_sharded_state(module, layer_sharded_state: Callable, gated: bool) -> Callable:
    """The layer's sharded_state_dict with its adapter's tensors sharded along the axis they
    are split on (the layer's own method would store them as TP replicas); a gated fc1's B
    stored as gate rows then up rows, as megatron stores the weight, so any TP size reads it."""
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    def sharded_state_dict(prefix="", sharded_offsets=(), metadata=None):
        state = layer_sharded_state(prefix, sharded_offsets, metadata)
        own = module.lora.state_dict(prefix="lora.", keep_vars=True)
        axis = {"lora.B": 0} if module.lora.column else {"lora.A": 1}
        dp_cp = (metadata or {}).get("dp_cp_group")
        tp = module.lora.tp_group
        state.update(
            make_sharded_tensors_for_checkpoint(
                own, prefix, axis, sharded_offsets, tp_group=tp, dp_cp_group=dp_cp
            )
        )
        if gated:
            singleton = (metadata or {}).get("singleton_local_shards", False)
            key = f"{prefix}lora.B"
            state[key] = apply_swiglu_sharded_factory(state[key], sharded_offsets, singleton)
        return state

    return sharded_state_dict


def is_adapter_key(key: str) -> bool:
    """Whether a model state key is an adapter's (what a LoRA checkpoint holds)."""
    return ".lora." in key


@contextlib.contextmanager
def adapters_disabled(adapted: list[AdaptedLayer], when: bool = True) -> Iterator[None]:
    """Within (if `when`): the model is the base (the reference of KL)."""
    if not when:
        yield
        return
    for a in adapted:
        a.adapter.enabled = False
    try:
        yield
    finally:
        for a in adapted:
            a.adapter.enabled = True


def merged_weight(adapted: list[AdaptedLayer]) -> Callable[[torch.Tensor], torch.Tensor]:
    """param -> the tensor to export for it: an adapted layer's weight shard plus its scale·B·A,
    added in fp32 and rounded once into the weight's dtype, every other parameter as it is."""
    by_weight = {id(a.module.weight): a.adapter for a in adapted}

    def weight(param: torch.Tensor) -> torch.Tensor:
        adapter = by_weight.get(id(param))
        if adapter is None:
            return param
        return adapter.delta().add_(param).to(param.dtype)  # one fp32 shard alive, not three

    return weight


@torch.no_grad()
def adapter_tensors(adapted: list[AdaptedLayer], tcfg) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, full tensor in the adapters' dtype) of every adapter, q/k/v and gate/up split
    out of the fused layers (module docstring). A collective over TP: every rank consumes it in
    step. bf16 adapters leave as the forward runs them (their fp32 mains are the distributed
    optimizer's shards), as megatron's full-parameter export sends its bf16 weights."""
    from dagrl.backends.megatron.weights import _Fuse, _unfuse

    for a in sorted(adapted, key=lambda a: (a.layer, list(FUSED_LAYERS).index(a.kind))):
        names, path, column = FUSED_LAYERS[a.kind]
        fuse = _Fuse(_FUSES[a.kind])
        A, B = a.adapter.A.detach(), a.adapter.B.detach()
        if column:
            shards = [_unfuse(s, fuse, tcfg) for s in _tp_gather(B, a.adapter.tp_group)]
            pieces = [torch.cat(parts, dim=0) for parts in zip(*shards)]
        else:
            A, pieces = torch.cat(_tp_gather(A, a.adapter.tp_group), dim=1), [B]
        for hf, b in zip(names, pieces):
            if hf not in a.targeted:  # a part of a fused layer left out: its rows of B are zero
                continue
            prefix = f"{PEFT_PREFIX}.{a.layer}.{path}.{hf}"
            yield f"{prefix}.lora_A.weight", A.clone()
            yield f"{prefix}.lora_B.weight", b.contiguous()


def _tp_gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    size = torch.distributed.get_world_size(group)
    if size == 1:
        return [t]
    out = [torch.empty_like(t) for _ in range(size)]
    torch.distributed.all_gather(out, t.contiguous(), group=group)
    return out


def save_adapter_dir(
    adapted: list[AdaptedLayer], tcfg, lora: LoraSettings, base_path: str, out_dir: str
) -> None:
    """A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) of the
    adapters, loadable with peft on the base model at `base_path`. Collective (the TP gather);
    global rank 0 writes."""
    import os

    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors = dict(adapter_tensors(adapted, tcfg))
    if torch.distributed.get_rank() != 0:
        return
    os.makedirs(out_dir, exist_ok=True)
    LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=hf_target_names(lora.target_modules),
        lora_dropout=lora.dropout,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    ).save_pretrained(out_dir)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(cpu, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})


def adapter_params(shape, lora: LoraSettings, tp: int = 1) -> float:
    """Adapter parameters on one rank of a decoder of `shape`: r·(in + out) per fused layer,
    the split side divided over TP."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    # (replicated side, split side) of each layer: column-parallel A [r, in], B [out/tp, r]
    dims = {
        "linear_qkv": (h, q + 2 * kv),
        "linear_proj": (h, q),
        "linear_fc1": (h, 2 * i),
        "linear_fc2": (h, i),
    }
    layers, _ = target_layers(lora.target_modules)
    per_layer = sum(rep + split / tp for name, (rep, split) in dims.items() if name in layers)
    return lora.rank * per_layer * shape.layers
