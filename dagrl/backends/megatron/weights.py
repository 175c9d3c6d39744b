"""HF safetensors <-> megatron-core GPTModel parameters, shard by shard.

Every megatron parameter maps to one or more HF tensors by a `_Rule`:

    megatron (per layer, local spec | TE spec)          HF (model.layers.{L}.)
    input_layernorm.weight | linear_qkv.layer_norm_weight   input_layernorm.weight
    self_attention.linear_qkv.{weight,bias}   [QKV]       self_attn.{q,k,v}_proj.{weight,bias}
    self_attention.{q,k}_layernorm.weight                 self_attn.{q,k}_norm.weight
    self_attention.linear_proj.weight         [TP dim 1]  self_attn.o_proj.weight
    pre_mlp_layernorm.weight | linear_fc1.layer_norm_weight post_attention_layernorm.weight
    mlp.linear_fc1.weight                     [GATE_UP]   mlp.{gate,up}_proj.weight
    mlp.linear_fc2.weight                     [TP dim 1]  mlp.down_proj.weight
    mlp.router.weight                                     mlp.gate.weight
    mlp.experts.{local j}.linear_fc1/2        [EP]        mlp.experts.{ep_rank*n_local+j}.{gate,up,down}_proj.weight

Fused layouts, per TP shard (a rank owns query groups [r*G/tp, (r+1)*G/tp) and MLP rows [r*I/tp, ...)):
    QKV:     for each owned query group g: [q heads of g (heads/G * d rows); k_g (d); v_g (d)]
    GATE_UP: [gate rows of this shard; up rows of this shard]
So a shard is built from the same row range of each HF tensor, and `_fuse`/`_unfuse` work shard-locally.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

_SAFETENSORS_INDEX = "model.safetensors.index.json"
_MAX_SHARD_BYTES = 5 * 1024**3
_TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt|chat_template\..*"
    r"|generation_config\.json)$"
)


class _Fuse(enum.Enum):
    NONE = "none"
    QKV = "qkv"
    GATE_UP = "gate_up"


@dataclass(frozen=True)
class _Rule:
    hf: tuple[str, ...]  # HF names; per-layer ones relative to model.layers.{L}., experts with {e}
    fuse: _Fuse
    tp_dim: int | None  # dim split over (expert-)TP ranks; None = replicated


_QKV_W = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_QKV_B = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
_EXPERT_FC1 = ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight")
# dict order = HF state_dict order within each section
_RULES: dict[str, _Rule] = {
    "embedding.word_embeddings.weight": _Rule(("model.embed_tokens.weight",), _Fuse.NONE, 0),
    "self_attention.linear_qkv.weight": _Rule(_QKV_W, _Fuse.QKV, 0),
    "self_attention.linear_qkv.bias": _Rule(_QKV_B, _Fuse.QKV, 0),
    "self_attention.linear_proj.weight": _Rule(("self_attn.o_proj.weight",), _Fuse.NONE, 1),
    "self_attention.q_layernorm.weight": _Rule(("self_attn.q_norm.weight",), _Fuse.NONE, None),
    "self_attention.k_layernorm.weight": _Rule(("self_attn.k_norm.weight",), _Fuse.NONE, None),
    "mlp.linear_fc1.weight": _Rule(("mlp.gate_proj.weight", "mlp.up_proj.weight"), _Fuse.GATE_UP, 0),
    "mlp.linear_fc2.weight": _Rule(("mlp.down_proj.weight",), _Fuse.NONE, 1),
    "mlp.experts.linear_fc1.weight": _Rule(_EXPERT_FC1, _Fuse.GATE_UP, 0),
    "mlp.experts.linear_fc2.weight": _Rule(("mlp.experts.{e}.down_proj.weight",), _Fuse.NONE, 1),
    "mlp.router.weight": _Rule(("mlp.gate.weight",), _Fuse.NONE, None),
    "input_layernorm.weight": _Rule(("input_layernorm.weight",), _Fuse.NONE, None),
    "self_attention.linear_qkv.layer_norm_weight": _Rule(("input_layernorm.weight",), _Fuse.NONE, None),
    "pre_mlp_layernorm.weight": _Rule(("post_attention_layernorm.weight",), _Fuse.NONE, None),
    "mlp.linear_fc1.layer_norm_weight": _Rule(("post_attention_layernorm.weight",), _Fuse.NONE, None),
    "decoder.final_layernorm.weight": _Rule(("model.norm.weight",), _Fuse.NONE, None),
    "output_layer.weight": _Rule(("lm_head.weight",), _Fuse.NONE, 0),
}
_VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")
_RULE_ORDER = {suffix: i for i, suffix in enumerate(_RULES)}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LOCAL_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(.+)$")  # SequentialMLP
_GROUPED_EXPERT_RE = re.compile(r"^(mlp\.experts\.linear_fc[12]\.weight)(\d+)$")  # TEGroupedMLP


@dataclass(frozen=True)
class _Entry:
    """One megatron parameter as every rank sees it: enough to name, shape and place its HF tensors."""

    pp_rank: int
    layer: int | None  # global layer index; None outside decoder.layers
    expert: int | None  # local expert index on its EP rank
    suffix: str  # key of _RULES
    shape: tuple[int, ...]  # this rank's shard
    dtype: torch.dtype

    def sort_key(self) -> tuple:
        section = 1 if self.layer is not None else (2 if self.suffix.startswith("decoder.") else 0)
        section = 3 if self.suffix == "output_layer.weight" else section
        return (section, self.layer or 0, _RULE_ORDER[self.suffix], self.expert or 0)


def _unwrap(chunk):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while not hasattr(chunk, "decoder") and hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _locate(model, name: str) -> tuple[int | None, int | None, str]:
    """(global layer, local expert, rule suffix) of a GPTModel parameter name."""
    m = _LAYER_RE.match(name)
    if m is None:
        assert name in _RULES, f"no HF mapping for megatron parameter {name}"
        return None, None, name
    layer = model.decoder.layers[int(m.group(1))].layer_number - 1  # layer_number is global, 1-based
    rest, expert = m.group(2), None
    if em := _LOCAL_EXPERT_RE.match(rest):
        expert, rest = int(em.group(1)), "mlp.experts." + em.group(2)
    elif em := _GROUPED_EXPERT_RE.match(rest):
        expert, rest = int(em.group(2)), em.group(1)
    assert rest in _RULES, f"no HF mapping for megatron parameter {name}"
    return layer, expert, rest


def _hf_names(entry: _Entry, expert_global: int | None, tied: bool) -> list[str]:
    if entry.suffix == "output_layer.weight" and tied:
        return ["model.embed_tokens.weight"]  # last-stage copy of the tied embedding
    names = _RULES[entry.suffix].hf
    if entry.layer is None:
        return list(names)
    prefix = f"model.layers.{entry.layer}."
    return [prefix + n.format(e=expert_global) for n in names]


def _heads(tcfg) -> tuple[int, int]:
    """(query heads per group, head dim) for the QKV layout."""
    return tcfg.num_attention_heads // tcfg.num_query_groups, tcfg.kv_channels


def _fuse(pieces: list[torch.Tensor], fuse: _Fuse, tcfg) -> torch.Tensor:
    """One rank's megatron shard from the same TP row range of each HF tensor (see module docstring)."""
    if fuse is _Fuse.NONE:
        return pieces[0]
    if fuse is _Fuse.GATE_UP:
        return torch.cat(pieces, dim=0)
    per_group, d = _heads(tcfg)
    q, k, v = pieces
    groups, rest = k.shape[0] // d, q.shape[1:]
    qkv = [q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)]
    return torch.cat(qkv, dim=1).reshape(-1, *rest)


def _unfuse(shard: torch.Tensor, fuse: _Fuse, tcfg) -> list[torch.Tensor]:
    """Inverse of `_fuse`: the HF row ranges held in one rank's shard."""
    if fuse is _Fuse.NONE:
        return [shard]
    if fuse is _Fuse.GATE_UP:
        return list(shard.chunk(2, dim=0))
    per_group, d = _heads(tcfg)
    rest = shard.shape[1:]
    grouped = shard.reshape(-1, (per_group + 2) * d, *rest)
    return [t.reshape(-1, *rest) for t in grouped.split([per_group * d, d, d], dim=1)]


def _tp_axis(expert: bool) -> tuple[int, int, dist.ProcessGroup]:
    """(rank, size, group) of the axis that shards this parameter: expert-TP for experts, else TP."""
    from megatron.core import parallel_state as ps

    if expert:
        return (
            ps.get_expert_tensor_parallel_rank(),
            ps.get_expert_tensor_parallel_world_size(),
            ps.get_expert_tensor_parallel_group(),
        )
    return (
        ps.get_tensor_model_parallel_rank(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_group(),
    )


def _expert_global(tcfg, local: int | None, ep_rank: int) -> int | None:
    if local is None:
        return None
    from megatron.core import parallel_state as ps

    return ep_rank * (tcfg.num_moe_experts // ps.get_expert_model_parallel_world_size()) + local


class _CheckpointReader:
    """Lazily opened safetensors files of one HF checkpoint; reads row/column slices, not whole tensors."""

    def __init__(self, hf_dir: str):
        from safetensors import safe_open

        self._safe_open, self._dir, self._handles = safe_open, hf_dir, {}
        index = os.path.join(hf_dir, _SAFETENSORS_INDEX)
        if os.path.isfile(index):
            with open(index) as f:
                self._files = json.load(f)["weight_map"]
        else:
            path = os.path.join(hf_dir, "model.safetensors")
            with safe_open(path, framework="pt") as f:
                self._files = dict.fromkeys(f.keys(), "model.safetensors")

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of `name`; rows past its end (vocabulary padding) are zeros."""
        sl = self._slice(name)
        rows = sl.get_shape()[0]
        part = sl[min(start, rows) : min(stop, rows)]
        pad = stop - start - part.shape[0]
        return torch.cat([part, part.new_zeros((pad, *part.shape[1:]))]) if pad else part

    def _slice(self, name: str):
        if name not in self._files:
            raise KeyError(f"{name} is not in the checkpoint at {self._dir}")
        file = self._files[name]
        if file not in self._handles:
            self._handles[file] = self._safe_open(os.path.join(self._dir, file), framework="pt")
        return self._handles[file].get_slice(name)

    def read(self, name: str, dim: int | None, rank: int, size: int) -> torch.Tensor:
        """Tensor `name`, or the `rank`-th of `size` equal slices of it along `dim`."""
        sl = self._slice(name)
        if dim is None:
            return sl[:]
        n, remainder = divmod(sl.get_shape()[dim], size)
        assert remainder == 0, f"{name} dim {dim} of {sl.get_shape()} does not split over {size} ranks"
        return sl[rank * n : (rank + 1) * n] if dim == 0 else sl[:, rank * n : (rank + 1) * n]


def _local_entries(chunks) -> list[tuple[_Entry, torch.nn.Parameter]]:
    from megatron.core import parallel_state as ps

    pp_rank = ps.get_pipeline_model_parallel_rank()
    out = []
    for chunk in chunks:
        model = _unwrap(chunk)
        for name, param in model.named_parameters():
            if ".lora." in name:  # LoRA adapters (lora.py) are no HF weight: merged or sent apart
                continue
            layer, expert, suffix = _locate(model, name)
            entry = _Entry(pp_rank, layer, expert, suffix, tuple(param.shape), param.dtype)
            out.append((entry, param))
    return out


@torch.no_grad()
def load_hf_weights(chunks: list, hf_dir: str) -> None:
    """Copy the HF checkpoint in `hf_dir` into this rank's parameters, in place (cast to their dtype).

    Each rank reads only its own slices: the layers of its PP/VPP chunks, its TP rows/columns,
    its EP experts. Handles single-file and index-sharded safetensors checkpoints.
    """
    from megatron.core import parallel_state as ps

    tcfg = _unwrap(chunks[0]).config
    tied = _unwrap(chunks[0]).share_embeddings_and_output_weights
    ep_rank = ps.get_expert_model_parallel_rank()
    reader = _CheckpointReader(hf_dir)
    for entry, param in _local_entries(chunks):
        rule = _RULES[entry.suffix]
        tp_rank, tp_size, _ = _tp_axis(entry.expert is not None)
        names = _hf_names(entry, _expert_global(tcfg, entry.expert, ep_rank), tied)
        if entry.suffix in _VOCAB_ROWS:  # padded to a multiple of TP: this rank's rows, zeros past V
            rows = param.shape[0]
            shard = reader.read_rows(names[0], tp_rank * rows, (tp_rank + 1) * rows)
        else:
            shard = _fuse([reader.read(n, rule.tp_dim, tp_rank, tp_size) for n in names], rule.fuse, tcfg)
        if shard.shape != param.shape:
            raise ValueError(
                f"{names} give a shard of shape {tuple(shard.shape)}, the model wants {param.shape}"
            )
        param.copy_(shard)


def _global_entries(local: list[tuple[_Entry, torch.nn.Parameter]], tied: bool) -> list[_Entry]:
    """Every PP stage's entries, in HF order; the tied embedding's last-stage copy is left out."""
    from megatron.core import parallel_state as ps

    mine = [e for e, _ in local if not (tied and e.suffix == "output_layer.weight")]
    if ps.get_pipeline_model_parallel_world_size() == 1:
        return sorted(mine, key=_Entry.sort_key)
    gathered: list = [None] * ps.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(gathered, mine, group=ps.get_pipeline_model_parallel_group())
    return sorted((e for stage in gathered for e in stage), key=_Entry.sort_key)


def _gather_tp(param: torch.Tensor, entry: _Entry, tcfg) -> list[torch.Tensor]:
    """Full HF tensors of this param from all (expert-)TP shards; shard-local unfuse, then concat."""
    rule = _RULES[entry.suffix]
    _, tp_size, group = _tp_axis(entry.expert is not None)
    shards = [param.detach()]
    if rule.tp_dim is not None and tp_size > 1:
        shards = [torch.empty_like(param) for _ in range(tp_size)]
        dist.all_gather(shards, param.detach().contiguous(), group=group)
    pieces = [_unfuse(s, rule.fuse, tcfg) for s in shards]
    if rule.tp_dim is None:
        return [p.clone() for p in pieces[0]]
    return [torch.cat(parts, dim=rule.tp_dim) for parts in zip(*pieces)]


def _full_shapes(entry: _Entry, tcfg) -> list[torch.Size]:
    """Shapes `_gather_tp` returns for `entry`, computed on the meta device by ranks that lack the param."""
    rule = _RULES[entry.suffix]
    _, tp_size, _ = _tp_axis(entry.expert is not None)
    shapes = []
    for piece in _unfuse(torch.empty(entry.shape, device="meta"), rule.fuse, tcfg):
        shape = list(piece.shape)
        if rule.tp_dim is not None:
            shape[rule.tp_dim] *= tp_size
        shapes.append(torch.Size(shape))
    return shapes


def _export_entry(entry: _Entry, param, tcfg, device) -> list[torch.Tensor]:
    """HF tensors of one entry on every rank: TP/EP gather on the owning stage, then PP broadcast.

    Experts come back as [hf names of EP rank 0's expert, EP rank 1's, ...].
    """
    from megatron.core import parallel_state as ps

    ep_size = ps.get_expert_model_parallel_world_size() if entry.expert is not None else 1
    if param is not None:
        tensors = _gather_tp(param, entry, tcfg)
        if ep_size > 1:
            per_rank = [[torch.empty_like(t) for _ in range(ep_size)] for t in tensors]
            for t, out in zip(tensors, per_rank):
                dist.all_gather(out, t.contiguous(), group=ps.get_expert_model_parallel_group())
            tensors = [per_rank[i][r] for r in range(ep_size) for i in range(len(tensors))]
    else:
        shapes = _full_shapes(entry, tcfg) * ep_size
        tensors = [torch.empty(s, dtype=entry.dtype, device=device) for s in shapes]
    if ps.get_pipeline_model_parallel_world_size() > 1:
        group = ps.get_pipeline_model_parallel_group()
        for t in tensors:
            dist.broadcast(t, group=group, group_src=entry.pp_rank)
    return tensors


@torch.no_grad()
def export_hf_weights(
    chunks: list, hf_config, weight: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every weight of the model, on every rank of the model-parallel group.

    A collective: all ranks must consume the iterator fully, in step. Tensors are in the params'
    dtype and device, in HF state_dict order except that experts of a layer come grouped by
    local index then EP rank, with HF's on-disk per-expert names (`mlp.experts.{e}.gate_proj.weight`).
    A tied output layer is not yielded (HF drops `lm_head.weight` when `tie_word_embeddings`).
    `weight(param)`, when given, is what leaves for a local parameter (LoRA: its merged shard).
    """
    from megatron.core import parallel_state as ps

    model = _unwrap(chunks[0])
    tcfg, tied = model.config, model.share_embeddings_and_output_weights
    assert tied == bool(getattr(hf_config, "tie_word_embeddings", False)), (
        "model and hf_config disagree on tying"
    )
    device = next(model.parameters()).device
    local = _local_entries(chunks)
    params = {e: p for e, p in local}
    ep_size = ps.get_expert_model_parallel_world_size()
    for entry in _global_entries(local, tied):
        param = params.get(entry)
        if param is not None and weight is not None:  # one merged shard alive at a time
            param = weight(param)
        tensors = _export_entry(entry, param, tcfg, device)
        ep_ranks = range(ep_size) if entry.expert is not None else [0]
        names = [n for r in ep_ranks for n in _hf_names(entry, _expert_global(tcfg, entry.expert, r), tied)]
        assert len(names) == len(tensors)
        if entry.suffix in _VOCAB_ROWS:  # drop the rows that pad the vocabulary to a multiple of TP
            tensors = [t[: hf_config.vocab_size] for t in tensors]
        yield from zip(names, tensors)


def _write_shards(named: Iterator[tuple[str, torch.Tensor]], out_dir: str) -> None:
    """model.safetensors, or model-0000i-of-0000N.safetensors + index json when over 5 GB."""
    from safetensors.torch import save_file

    files: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if files[-1] and size + nbytes > _MAX_SHARD_BYTES:
            files.append({})
            size = 0
        files[-1][name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
    if len(files) == 1:
        save_file(files[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, tensors in enumerate(files):
        fname = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        save_file(tensors, os.path.join(out_dir, fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(out_dir, _SAFETENSORS_INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def save_hf(chunks: list, hf_config, out_dir: str, *, tokenizer_dir: str | None = None, weight=None) -> None:
    """Write an HF checkpoint (safetensors + config.json [+ tokenizer]) from global rank 0.

    Every rank must call it (the weights are gathered collectively); it returns on all ranks
    after rank 0 has finished writing. Shards hold whole tensors and are kept under 5 GB.
    `weight`: as export_hf_weights'.
    """
    named = export_hf_weights(chunks, hf_config, weight)
    if dist.get_rank() != 0:
        for _ in named:
            pass
        dist.barrier()
        return
    os.makedirs(out_dir, exist_ok=True)
    _write_shards(named, out_dir)
    hf_config.save_pretrained(out_dir)
    if tokenizer_dir is not None:
        for fname in os.listdir(tokenizer_dir):
            if _TOKENIZER_FILES.match(fname):
                shutil.copy2(os.path.join(tokenizer_dir, fname), os.path.join(out_dir, fname))
    dist.barrier()
