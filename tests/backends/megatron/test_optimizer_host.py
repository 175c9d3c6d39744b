"""What megatron-core's CPU optimizer holds on the host (dagrl/backends/megatron/optimizer_host.py):
its tensors as megatron 0.16.1 lays them out, checked against megatron's own model and optimizer
built on the CPU, and its pinned blocks worked out by hand. The plan counted 16 bytes a parameter
before; none of these figures is measured on a card."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.megatron.memory import MegatronLayout, state_bytes
from dagrl.backends.megatron.optimizer_host import (
    Tensor,
    bounded_host_bytes,
    largest_tensor,
    listed_host_bytes,
    rank_shards,
    stage_tensors,
)
from dagrl.backends.memory import GIB
from dagrl.backends.model_shape import ModelShape
from tests.megatron_cpu_patch import run_distributed, tiny_gpt_config


def _shape(
    hidden, layers, heads, kv_heads, intermediate, vocab, tied, head_dim=None, experts=0
) -> ModelShape:
    """A Qwen3-style shape (q/k norms, no biases) with its parameters counted."""
    d = head_dim or hidden // heads
    q, kv = heads * d, kv_heads * d
    layer = hidden * (q + 2 * kv) + q * hidden + 2 * d + 3 * hidden * intermediate + 2 * hidden
    params = vocab * hidden * (1 if tied else 2) + layers * layer + hidden + experts
    return ModelShape(hidden, layers, heads, kv_heads, d, intermediate, vocab, tied, params, experts, True)


# tests/megatron_cpu_patch.py's tiny GPT with q/k norms: 2 (here 1) layers of 64, 4 heads of 16 in 2
# groups, SwiGLU 128, vocabulary 128
TINY = _shape(64, 1, 4, 2, 128, 128, tied=False)
QWEN3_8B = _shape(4096, 36, 32, 8, 12288, 151_936, tied=False, head_dim=128)


def host(shape: ModelShape, layout: MegatronLayout, fraction: float = 1.0) -> float:
    """The plan's host bytes of the CPU optimizer: bf16, distributed, precision-aware."""
    return state_bytes(shape, layout, "bfloat16", True, True, fraction, True)[1]


def test_each_tensor_rounds_up_on_its_own():
    """One layer by hand. Pinned fp32 gradients, each rounded up: the vocabulary matrices, qkv and
    fc2 32 KiB each, fc1 64, proj 16, three norms 256 B, the q/k norms 64: 213,888 B. The bf16
    copies pinned on the way to the fp32 masters leave one cached block per power of two:
    16 and 32 KiB ones a gradient takes, 8 KiB (proj), 128 B (the norms) and 32 B (q/k) left:
    8,352 B. Pageable: 12 bytes for each of the 53,472 parameters."""
    sizes = [t.numel for t in stage_tensors(TINY, 2, 1, 1, 0)]
    assert sizes == [8192, 64, 4096, 8192, 16, 16, 64, 16384, 8192, 64, 8192]
    assert TINY.params == sum(sizes) == 53_472
    assert listed_host_bytes(TINY, 2, 1, 1, 1, 1.0, True) == (213_888 + 8_352, 12 * 53_472)
    assert host(TINY, MegatronLayout()) == 863_904  # 16 B a parameter: 855,552


def test_dp2_shards_round_up_apart():
    """DP 2 by hand: the buffer lays the tensors out in reverse from the output layer, each on 64
    elements (the q norm at 32,960, not 32,912), the bucket padded to 53,632 and cut at 26,816,
    inside fc1. Rank 0: the output layer, the final norm, fc2 and 10,368 of fc1; rank 1 the rest.
    Rank 0 pins 57,504 B of cached bf16 copies (the first optimizer's, whole tensors: 16, 0.125,
    8, 0.03 and 32 KiB), which its pieces' copies reuse, and gradients of 32 KiB (one taken from
    the cache), 32 and 64 KiB and 256 B: 156,064 B, beside 12 x 26,816 pageable."""
    tensors = stage_tensors(TINY, 2, 1, 1, 0)
    # (index in megatron's named order, elements): weight decay first, then the norms
    assert rank_shards(tensors, 2, 0) == [(10, 8192), (8, 8192), (7, 10_368), (9, 64)]
    assert rank_shards(tensors, 2, 1) == [
        (7, 6016), (3, 8192), (2, 4096), (0, 8192), (6, 64), (5, 16), (4, 16), (1, 64)
    ]  # fmt: skip
    assert host(TINY, MegatronLayout(dp=2, workers=2)) == 156_064 + 12 * 26_816  # 16 B: 427,776


def test_8b_holds_more_than_16_bytes_a_parameter():
    """Qwen3-8B, TP 1: 43.78 GiB pinned (fp32 gradients rounded up 1.37x, and the vocabulary
    matrices' 2 GiB bf16 block) + 91.54 pageable, against 122.05 at 16 B a parameter; TP 2 halves
    it (norms whole); at DP 2 the larger rank holds 68.68, not half of 135.32."""
    pinned, pageable = listed_host_bytes(QWEN3_8B, 2, 1, 1, 1, 1.0, True)
    assert (round(pinned / GIB, 2), round(pageable / GIB, 2)) == (43.78, 91.54)
    assert 16 * QWEN3_8B.params / GIB == pytest.approx(122.05, abs=0.005)
    assert host(QWEN3_8B, MegatronLayout()) / GIB == pytest.approx(135.32, abs=0.005)
    assert host(QWEN3_8B, MegatronLayout(tp=2, workers=2)) / GIB == pytest.approx(67.66, abs=0.005)
    assert host(QWEN3_8B, MegatronLayout(dp=2, workers=2)) / GIB == pytest.approx(68.68, abs=0.005)


def test_a_share_offloads_megatrons_first_tensors():
    """optimizer_offload_fraction: HybridDeviceOptimizer takes tensors in its list's order while
    the elements taken are below the share; nothing at 0. The tiny model's list at DP 1 begins
    with the output layer and fc2 (16,384 of 53,472 elements, under 0.31), then fc1."""
    assert host(TINY, MegatronLayout(), fraction=0.0) == 0
    output_and_fc2 = listed_host_bytes(TINY, 2, 1, 1, 1, 0.3, True)
    with_fc1 = listed_host_bytes(TINY, 2, 1, 1, 1, 0.31, True)
    assert output_and_fc2[1] == 12 * 16_384 and with_fc1[1] == 12 * 32_768


def test_moe_is_bounded():
    """A shape whose tensors cannot be listed (routed experts): every pinned fp32 gradient at twice
    its bytes, the cached bf16 copies at 4x the largest tensor's bytes (a layer's experts here),
    12 pageable bytes a parameter."""
    moe = _shape(2048, 24, 16, 4, 1024, 151_936, tied=False, head_dim=128, experts=24 * 128 * 3 * 2048 * 768)
    largest = largest_tensor(moe, 1, 1, 1)
    assert largest == moe.expert_params // 24
    assert host(moe, MegatronLayout()) == 8 * moe.params + 4 * 2 * largest + 12 * moe.params


@pytest.mark.parametrize("dp", [1, 2, 4])
@pytest.mark.parametrize(
    "shape",
    [
        _shape(1024, 28, 16, 8, 3072, 151_936, tied=True, head_dim=128),
        _shape(2560, 36, 32, 8, 9728, 151_936, tied=True, head_dim=128),
        QWEN3_8B,
    ],
    ids=["0.6b", "4b", "8b"],
)
def test_the_bound_holds_where_the_tensors_are_listed(shape, dp):
    listed = sum(listed_host_bytes(shape, 2, 1, 1, dp, 1.0, True))
    whole = shape.params
    bound = sum(bounded_host_bytes(whole / dp, whole, largest_tensor(shape, 1, 1, 1), 2, True, dp > 1))
    assert 16 * whole / dp < listed <= bound


def _megatron_layout(rank: int, world: int, tp: int, tied: bool, masters_on_host: bool):
    """(named parameters as (elements, decayed), the CPU optimizer's tensors as (elements, dtype)):
    megatron-core's tiny bf16 GPT with q/k norms and the CPU optimizer as the backend builds it."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from dagrl.backends.megatron.optimizer import build_optimizer, optimizer_config
    from dagrl.config.schema import ActorConfig, MegatronConfig

    real = torch.cuda.current_stream  # the optimizer's build asks for it, never uses it on the CPU
    torch.cuda.current_stream = lambda *args, **kwargs: None
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        tensor_parallel.model_parallel_cuda_manual_seed(1)
        config = tiny_gpt_config(
            num_layers=1,
            bf16=True,
            params_dtype=torch.bfloat16,
            qk_layernorm=True,
            tensor_model_parallel_size=tp,
        )
        gpt = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=True),
            vocab_size=128,
            max_sequence_length=16,
            position_embedding_type="rope",
            share_embeddings_and_output_weights=tied,
        ).bfloat16()
        named = [(p.numel(), p.dim() == 2 and not n.endswith(".bias")) for n, p in gpt.named_parameters()]
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
        ddp = DistributedDataParallel(config, ddp_config, gpt)
        megatron = MegatronConfig(
            optimizer_cpu_offload=True,
            use_distributed_optimizer=True,
            use_precision_aware_optimizer=masters_on_host,
        )
        [distributed] = build_optimizer(
            optimizer_config(ActorConfig(), megatron, torch.bfloat16), [ddp]
        ).chained_optimizers
        held = [
            (p.numel(), p.dtype.itemsize) for g in distributed.optimizer.param_groups for p in g["params"]
        ]
    finally:
        torch.cuda.current_stream = real
    return named, held


@pytest.mark.parametrize(
    "tp, tied, masters_on_host",
    [(1, False, True), (1, True, False), (2, False, True)],
    ids=["dp2", "dp2-tied", "tp2"],
)
def test_megatron_lays_the_tensors_out_so(tp, tied, masters_on_host):
    """megatron-core 0.16.1 on two gloo ranks: its named parameters are stage_tensors', and the
    CPU optimizer it builds holds rank_shards' pieces, in its order: bf16 views of the parameters
    with the masters on the host, the distributed optimizer's fp32 main shards without."""
    shape = _shape(64, 1, 4, 2, 128, 128, tied=tied)
    dp = 2 // tp
    tensors = stage_tensors(shape, 2, tp, 1, 0)
    for rank, (named, held) in enumerate(run_distributed(_megatron_layout, 2, tp, tied, masters_on_host)):
        assert named == [(t.numel, t.decayed) for t in tensors]
        width = 2 if masters_on_host else 4
        assert held == [(n, width) for _, n in rank_shards(tensors, dp, rank % dp)]


def test_a_tied_embedding_under_pp_takes_its_own_bucket():
    """Under PP the tied embedding's copy on the last stage opens and closes a bucket of its own,
    padded to lcm(DP, 128): the layers' shards start after it."""
    shape = _shape(64, 2, 4, 2, 128, 128, tied=True)
    last = stage_tensors(shape, 2, 1, 2, 1)
    assert last[-1] == Tensor(8192, True, 2, own_bucket=True) and last[0].numel == 64
    pieces = dict(rank_shards(last, 2, 0))
    assert pieces[len(last) - 1] == 4096  # half of the vocabulary matrix's bucket
