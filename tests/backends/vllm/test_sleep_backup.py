"""What a vLLM engine asleep at level 1 pins on the host (dagrl/backends/vllm/sleep_backup.py),
against what vLLM logged at sleep on an H200 and torch's allocators worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from dagrl.backends.memory import GIB
from dagrl.backends.model_shape import ModelShape, read_model_shape
from dagrl.backends.vllm.memory import rollout_memory
from dagrl.backends.vllm.sleep_backup import backup_bytes, cuda_segments, weight_allocations
from dagrl.config.role_specs import role_spec
from dagrl.data.builtin import tiny_model_path
from tests.conftest import validated_config
from tools.random_qwen3 import build_random_qwen3

MIB = 1 << 20
R = "actor_rollout_ref.rollout"

# vLLM 0.26.0's "CuMemAllocator: sleep freed ..., of which X GiB is backed up in CPU" at the first
# sleep: H200, bf16, TP 1, max_num_seqs 1024 (vLLM's default there), random-weight Qwen3 shapes of
# tools/random_qwen3.py (max_position_embeddings 4096), 2026-11-28; and the weights' own GiB
BACKED_UP_GIB = {
    "8b": ((4096, 36, 32, 8, 12288), 15.90, 15.26),  # untied
    "4b": ((2560, 36, 32, 8, 9728), 8.19, 7.49),  # tied
}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, ModelShape]:
    out = {}
    for name, (dims, _, _) in BACKED_UP_GIB.items():
        path = build_random_qwen3(
            str(tmp_path_factory.mktemp(name)), *dims, 151936, head_dim=128, config_only=True
        )
        out[name] = read_model_shape(path)
    return out


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _host_gib(shape: ModelShape, card_gib: float, *overrides: str) -> float:
    """The rollout's host figure in the plan, the engine asleep beside a trainer."""
    sleeps = (f"{R}.name=vllm", f"{R}.free_cache_engine=true", "actor_rollout_ref.model.dtype=bfloat16")
    cfg = validated_config(*sleeps, *overrides)
    return rollout_memory(None, role_spec(cfg, "rollout"), None, shape, card_gib * GIB, 2).host / GIB


@pytest.mark.parametrize("name", sorted(BACKED_UP_GIB))
def test_the_backup_is_what_vllm_logged(shapes, name):
    """The weights alone were 0.64 (8B) and 0.70 (4B) GiB short: the sampler's tables (0.60 GiB at
    1024 requests) and, at the 4B's width, the 2 MiB rounding of every large tensor."""
    _, logged, weights = BACKED_UP_GIB[name]
    shape = shapes[name]
    assert shape.params * 2 / GIB == pytest.approx(weights, abs=0.005) and shape.max_positions == 4096
    backed_up, _ = backup_bytes(shape, 2, 1, 1024)
    assert abs(backed_up / GIB - logged) <= 0.05, backed_up / GIB


def test_the_plan_counts_the_pinned_copy_of_every_segment(shapes):
    """The 8b-torch row (2 x H200) read its process's RSS at 161.8 GiB where the plan said 152.58
    (train 137.32 + rollout 15.26, the weights alone): the engine's part now reads 21.97 (every
    segment a power of two: the embedding's and lm_head's 1187 MiB take 2 GiB each, the sampler's
    594 MiB 1 GiB), 159.29 in all."""
    shape = shapes["8b"]
    backed_up, pinned = backup_bytes(shape, 2, 1, 1024)
    allocations = [n for _, n in weight_allocations(shape, 2, 1, 1024)]
    segments = cuda_segments(allocations)
    assert sum(segments) == backed_up and pinned == sum(_pow2(s) for s in segments)
    assert _host_gib(shape, 139.8) == pinned / GIB == pytest.approx(21.97, abs=0.005)
    assert 137.32 + pinned / GIB == pytest.approx(159.29, abs=0.01)


def test_max_num_seqs_sizes_the_sampler_tables(shapes):
    """vLLM's default is 1024 requests on cards of 70 GiB and more, 256 below; a set max_num_seqs wins.
    The output counts ([requests, vocab] int32) are 594 MiB at 1024, 148 at 256: pinned 1 GiB and
    256 MiB; the other tables take three 20 MiB segments (32 MiB pinned each) at 1024, one at 256,
    besides a few 2 MiB ones."""
    shape = shapes["8b"]
    large, small = _host_gib(shape, 139.8), _host_gib(shape, 40)
    assert large - small == pytest.approx(0.75 + 0.06, abs=0.005)
    assert _host_gib(shape, 139.8, f"{R}.max_num_seqs=256") == small
    assert _host_gib(shape, 139.8, f"{R}.sleep_level=2") == 0.0


def test_cuda_segments_as_torchs_allocator_maps_them():
    """Worked by hand: 4 MiB opens a shared 20 MiB segment, the next 4 MiB takes 4 of its 16 left;
    18.5 MiB (from 10 MiB: its own, rounded to 2 MiB) opens 20 MiB and leaves 1.5 free; 600 MiB and
    a byte opens 602 MiB (600.0005 rounded up); 100 bytes open a 2 MiB small segment; 1 MiB and a
    byte takes the 1.5 MiB left (the smallest free block that holds it); 1 MiB takes the rest of the
    small segment; a second 1 MiB opens another."""
    sizes = [4 * MIB, 4 * MIB, 37 * MIB // 2, 600 * MIB + 1, 100, MIB + 1, MIB, MIB, 0]
    assert cuda_segments(sizes) == [20 * MIB, 20 * MIB, 602 * MIB, 2 * MIB, 2 * MIB]


def test_tensor_parallel_halves_the_sharded_tensors(shapes):
    """At TP 2 the fused qkv (32 q + 2 x 8 kv heads), o_proj, gate_up, down, the embedding and
    lm_head halve; the norms, the rotary cache, the attention's scalars and the sampler's tables
    stay whole. Below one kv head a shard, the kv heads are replicated."""
    shape = shapes["8b"]

    def by_name(tp: int, kv_heads: int = 8) -> dict[str, int]:
        shards: dict[str, int] = {}
        for name, n in weight_allocations(dataclasses.replace(shape, kv_heads=kv_heads), 2, tp, 1024):
            shards[name] = shards.get(name, 0) + n
        return shards

    one, two = by_name(1), by_name(2)
    split = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "embed_tokens", "lm_head"}
    assert {name for name in one if two[name] * 2 == one[name]} == split
    assert all(two[name] == one[name] for name in set(one) - split)
    backed_up, _ = backup_bytes(shape, 2, 2, 1024)
    assert backed_up / GIB == pytest.approx(8.27, abs=0.005)  # 7.63 of weights, 0.60 of tables
    # 2 kv heads over TP 4: one each (q 8 heads + 2 x 1), not half a head
    assert by_name(4, kv_heads=2)["qkv_proj"] == 36 * 4096 * (8 + 2) * 128 * 2


def test_a_tiny_models_backup_is_a_few_segments():
    """The built-in 4-layer model (Qwen2: q/k/v biases, 3.1 MiB in fp32): its tensors share 2 MiB
    segments; at 256 requests its sampler's tables (1 MiB or less each) do too (8 MiB in all,
    already powers of two); at 1024 the 1 MiB-and-more tables share one 20 MiB segment, pinned 32."""
    shape = read_model_shape(tiny_model_path())
    names = {name for name, _ in weight_allocations(shape, 4, 1, 256)}
    assert "qkv_bias" in names and "lm_head" not in names
    assert backup_bytes(shape, 4, 1, 256) == (8 * MIB, 8 * MIB)
    assert backup_bytes(shape, 4, 1, 1024) == (26 * MIB, 38 * MIB)


def test_a_moe_shape_lists_its_experts_fused():
    """tensor_numels cannot list a MoE model: its routed experts are taken as vLLM's FusedMoE holds
    them (w13 and w2 per layer, split over TP) and what else is left of the parameters as one tensor
    per layer, whole: never less than the shard's weights."""
    dense = ModelShape(2048, 4, 16, 4, 128, 1536, 151936, False, 0, qk_norm=True)
    experts = 4 * 64 * 3 * 2048 * 768  # 64 experts of width 768 a layer
    attention = 2048 * (2048 + 2 * 512) + 2048 * 2048 + 2 * 2048 + 2 * 128
    router = 64 * 2048
    params = 2 * 151936 * 2048 + 2048 + 4 * (attention + router) + experts
    shape = dataclasses.replace(dense, params=params, expert_params=experts)
    for tp in (1, 2):
        allocations = dict(weight_allocations(shape, 2, tp, 256))
        assert allocations["w13"] == 2 * allocations["w2"] == 2 * 64 * 2048 * 768 * 2 // tp
        assert allocations["rest"] == router * 2
        assert backup_bytes(shape, 2, tp, 256)[0] >= params * 2 / tp
