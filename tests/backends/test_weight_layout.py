"""The direct refresh's layout: learnt from an engine whose loader fuses tensors as vLLM's does
(q/k/v into one parameter, gate/up into another, a tied output layer skipped), then used to pack
on one side and copy into parameters on the other, in-process and over a real gloo group."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.weight_broadcast import BroadcastGroup
from dagrl.backends.weight_layout import (
    PackViews,
    Piece,
    RecipeBuilder,
    Slot,
    bucket_bytes,
    find_rows,
    pack_into,
    plan_buckets,
    unpack_into,
)
from tests.gloo_threads import free_port, on_threads

H, Q, KV, FF, V = 8, 8, 4, 12, 10  # hidden, q rows, k/v rows, intermediate, vocabulary


class FusedEngine(torch.nn.Module):
    """Parameters laid out like a vLLM Llama/Qwen with TP=1; `load_weights` fuses like its loaders."""

    FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", Q), "v_proj": ("qkv_proj", Q + KV)}
    FUSED |= {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", FF)}

    def __init__(self, dtype=torch.float32, scale_down: float = 1.0, pad_vocab: int = 6):
        super().__init__()
        # vLLM pads the vocabulary to a multiple of 64 rows; its loader zero-fills the spare rows
        self.embed_tokens = torch.nn.Parameter(torch.zeros(V + pad_vocab, H, dtype=dtype))
        self.qkv_proj = torch.nn.Parameter(torch.zeros(Q + 2 * KV, H, dtype=dtype))
        self.qkv_bias = torch.nn.Parameter(torch.zeros(Q + 2 * KV, dtype=dtype))
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(2 * FF, H, dtype=dtype))
        self.down_proj = torch.nn.Parameter(torch.zeros(H, FF, dtype=dtype))
        self.norm = torch.nn.Parameter(torch.zeros(H, dtype=dtype))
        self.scale_down = scale_down  # a loader that transforms values (1.0: it does not)

    def params(self) -> dict[str, torch.Tensor]:
        names = {
            "embed_tokens": "model.embed_tokens.weight",
            "qkv_proj": "model.layers.0.self_attn.qkv_proj.weight",
            "qkv_bias": "model.layers.0.self_attn.qkv_proj.bias",
            "gate_up_proj": "model.layers.0.mlp.gate_up_proj.weight",
            "down_proj": "model.layers.0.mlp.down_proj.weight",
            "norm": "model.norm.weight",
        }
        return {names[n]: p for n, p in self.named_parameters()}

    @torch.no_grad()
    def load_weights(self, bucket: dict[str, torch.Tensor]) -> None:
        params = self.params()
        for name, tensor in bucket.items():
            if name == "lm_head.weight":  # tied to the embedding: the engine skips it
                continue
            module, _, kind = name.rpartition(".")
            prefix, _, leaf = module.rpartition(".")
            if name == "model.embed_tokens.weight":
                params[name][: tensor.shape[0]].copy_(tensor * self.scale_down)
                params[name][tensor.shape[0] :].zero_()
            elif leaf in self.FUSED:
                fused, row = self.FUSED[leaf]
                target = params[f"{prefix}.{fused}.{kind}"]
                target[row : row + tensor.shape[0]].copy_(tensor * self.scale_down)
            else:
                params[name].copy_(tensor * self.scale_down)


def hf_weights(seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "model.embed_tokens.weight": (V, H),
        "model.layers.0.self_attn.q_proj.weight": (Q, H),
        "model.layers.0.self_attn.k_proj.weight": (KV, H),
        "model.layers.0.self_attn.v_proj.weight": (KV, H),
        "model.layers.0.self_attn.q_proj.bias": (Q,),
        "model.layers.0.self_attn.k_proj.bias": (KV,),
        "model.layers.0.self_attn.v_proj.bias": (KV,),
        "model.layers.0.mlp.gate_proj.weight": (FF, H),
        "model.layers.0.mlp.up_proj.weight": (FF, H),
        "model.layers.0.mlp.down_proj.weight": (H, FF),
        "model.norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    return {name: torch.randn(shape, generator=g).to(dtype) for name, shape in shapes.items()}


def split(weights: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Two buckets that cut the fused q/k/v between them (a fused parameter learnt across buckets)."""
    names = list(weights)
    return [{n: weights[n] for n in names[:2]}, {n: weights[n] for n in names[2:]}]


def learn(engine: FusedEngine, weights: dict[str, torch.Tensor]):
    builder = RecipeBuilder(engine.params(), seed=1)
    for bucket in split(weights):
        builder.observe(bucket, engine.load_weights)
        engine.load_weights(bucket)
        builder.verify(bucket)
    return builder.finish(), builder


def test_find_rows_locates_runs_of_rows_and_vectors():
    p = torch.arange(24.0).reshape(6, 4)
    assert find_rows(p, p[2:5].clone()) == [2]
    assert find_rows(p, p[:, :2].clone()) == []  # other trailing shape
    v = torch.tensor([5.0, 1.0, 2.0, 1.0, 2.0])
    assert find_rows(v, torch.tensor([1.0, 2.0])) == [1, 3]  # found twice: the builder refuses that
    assert find_rows(torch.tensor(3.0), torch.tensor(3.0)) == [0]


def test_learnt_slots_match_the_engines_fusion():
    engine = FusedEngine()
    slots, builder = learn(engine, hf_weights(0))
    assert builder.reason is None, builder.reason
    by_param = {s.param: s for s in slots}
    qkv = by_param["model.layers.0.self_attn.qkv_proj.weight"]
    assert [(p.source.split(".")[-2], p.row, p.rows) for p in qkv.pieces] == [
        ("q_proj", 0, Q),
        ("k_proj", Q, KV),
        ("v_proj", Q + KV, KV),
    ]
    bias = by_param["model.layers.0.self_attn.qkv_proj.bias"]
    assert [p.row for p in bias.pieces] == [0, Q, Q + KV]
    assert [s.param for s in slots] == list(engine.params())
    assert all("lm_head" not in p.source for s in slots for p in s.pieces)
    # the real weights are in place after learning (the probes were overwritten)
    assert torch.equal(engine.qkv_proj[Q : Q + KV], hf_weights(0)["model.layers.0.self_attn.k_proj.weight"])


@pytest.mark.parametrize("limit", [1, 64, 10**9])  # one slot per bucket, a few, all in one
def test_pack_then_unpack_equals_the_engines_own_loader(limit):
    slots, _ = learn(FusedEngine(), hf_weights(0))
    new = hf_weights(7, torch.bfloat16)  # the trainer's dtype differs: the copy casts
    reference = FusedEngine()
    reference.load_weights({k: v.float() for k, v in new.items()})
    plan = plan_buckets(slots, limit)
    views = PackViews(plan)  # the sender's recipe: the same bytes as pack_into's
    for pack in (pack_into, lambda bucket, sources, buffer: views.pack(plan.index(bucket), sources, buffer)):
        direct = FusedEngine()
        for bucket in plan:
            size = bucket[-1][1] + bucket[-1][0].nbytes
            buffer = torch.empty(size, dtype=torch.uint8)
            pack(bucket, new, buffer)
            unpack_into(bucket, buffer, direct.params())
        for name, p in reference.params().items():
            assert torch.equal(direct.params()[name], p), name


def test_the_senders_recipe_packs_gaps_cut_rows_and_mixed_dtypes_as_pack_into():
    """PackViews against pack_into byte for byte: a 3-float vector (a 4-byte gap after it), a
    matrix cut over buckets (pieces from a source's middle rows), a bucket of two dtypes."""
    g = torch.Generator().manual_seed(3)
    sources = {
        "v": torch.randn(3, generator=g),
        "w": torch.randn(6, 2, generator=g),
        "u": torch.randn(2, 4, generator=g).bfloat16(),
        "x": torch.randn(5, 4, generator=g),
    }
    slots = [
        Slot("p.v", torch.float32, (3,), (Piece("v", 0, 3),)),
        Slot("p.w", torch.float32, (6, 2), (Piece("w", 0, 6),)),
        Slot("p.ux", torch.bfloat16, (7, 4), (Piece("u", 0, 2), Piece("x", 2, 5))),  # casts x
    ]
    for limit in (40, 64, 10**6):
        plan = plan_buckets(slots, limit)
        views = PackViews(plan)
        assert any(r is None for r in views.recipes) == (limit == 10**6)  # all in one: mixed
        assert any(p.src_row for b in plan for s, _ in b for p in s.pieces) == (limit == 40)
        # at 64, v and w share a bucket of one dtype: w starts after a 4-byte gap
        gap = any(b[0][0].param == "p.v" and len(b) > 1 for b, r in zip(plan, views.recipes) if r is not None)
        assert gap == (limit == 64)
        for i, bucket in enumerate(plan):
            expected = torch.zeros(bucket_bytes(bucket), dtype=torch.uint8)
            got = torch.zeros(bucket_bytes(bucket), dtype=torch.uint8)
            pack_into(bucket, sources, expected)
            views.pack(i, sources, got)
            assert torch.equal(got, expected), (limit, i)


def test_a_loader_that_transforms_values_keeps_the_ordinary_path():
    slots, builder = learn(FusedEngine(scale_down=0.5), hf_weights(0))
    assert slots is None and "values no HF tensor holds" in builder.reason


def test_rows_the_loader_never_writes_stay_out_of_the_layout():
    weights = hf_weights(0)
    del weights["model.layers.0.self_attn.v_proj.weight"]
    slots, builder = learn(FusedEngine(), weights)
    assert builder.reason is None
    by_param = {s.param: s for s in slots}
    assert len(by_param["model.layers.0.self_attn.qkv_proj.weight"].pieces) == 2
    embed = by_param["model.embed_tokens.weight"]
    assert embed.nbytes == V * H * 4  # the padded vocabulary's spare rows do not travel


def test_overlapping_runs_keep_the_ordinary_path():
    class Overlapping(FusedEngine):
        FUSED = {**FusedEngine.FUSED, "k_proj": ("qkv_proj", Q - 1)}  # k written over q's last row

    slots, builder = learn(Overlapping(), hf_weights(0))
    assert slots is None and builder.reason


def test_a_parameter_the_loader_never_writes_is_left_alone():
    weights = hf_weights(0)
    del weights["model.norm.weight"]
    slots, builder = learn(FusedEngine(), weights)
    assert builder.reason is None and "model.norm.weight" not in {s.param for s in slots}


def test_direct_broadcast_over_gloo_reaches_every_receiver():
    # one sender and two receivers on threads of this process (gloo runs the broadcasts on its
    # own threads; separate processes cost ~15 s of imports on CI and checked nothing more)
    slots, _ = learn(FusedEngine(), hf_weights(0))
    port = free_port()
    out = {}

    def member(rank: int) -> None:
        group = BroadcastGroup("127.0.0.1", port, rank, 3, torch.device("cpu"))
        plan = plan_buckets(slots, 256)
        if rank == 0:
            # the export's buckets do not line up with the plan's, and carry a tensor no slot uses
            exported = [{"unused.buffer": torch.ones(3)}, *split(hf_weights(3))]
            out[rank] = (group.send_direct(plan, iter(exported)), None)
            return
        engine = FusedEngine()
        out[rank] = (group.receive_direct(plan, engine.params()), engine.params())

    on_threads(3, member)
    reference = FusedEngine()
    reference.load_weights(hf_weights(3))
    param_bytes = sum(p.numel() * 4 for p in reference.parameters()) - 6 * H * 4  # no spare vocabulary rows
    assert param_bytes == sum(s.nbytes for s in slots)
    assert out[0][0] >= param_bytes  # aligned to 16 bytes per slot
    for rank in (1, 2):
        nbytes, got = out[rank]
        assert nbytes == param_bytes
        assert all(torch.equal(got[k], v) for k, v in reference.params().items())
