"""LoRA's keys (verl's, ms-swift's, PEFT's), the specs they give, the reference that becomes the
actor's base, and every refusal before Ray starts naming its key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dagrl.config.role_specs import build_role_specs
from dagrl.config.roles import role_aliases
from dagrl.config.validate import resolve_defaults, validate
from dagrl.errors import ConfigError
from dagrl.main import compose

M, R = "actor_rollout_ref.model", "actor_rollout_ref.rollout"
BF16 = "actor_rollout_ref.model.dtype=bfloat16"
MEGATRON = "actor_rollout_ref.actor.strategy=megatron"
ADAPTER = f"{R}.lora_sync=adapter"
SEPARATE = ("placement=separate", "trainer.n_gpus_per_node=2", "trainer.device=cuda")


def typed(*overrides: str):
    cfg = OmegaConf.to_object(compose(list(overrides)))
    resolve_defaults(cfg)
    return cfg


def test_verl_keys_give_the_train_and_rollout_specs_their_lora():
    cfg = typed(f"{M}.lora_rank=16", f"{M}.lora_alpha=32", f"{M}.target_modules=[q_proj,v_proj]")
    validate(cfg)
    specs = build_role_specs(cfg, ["train", "rollout", "ref"])
    lora = specs["train"].lora
    assert (lora.rank, lora.alpha, lora.target_modules, lora.sync) == (
        16,
        32.0,
        ("q_proj", "v_proj"),
        "merged",
    )
    assert specs["rollout"].lora == lora and specs["ref"].lora is None  # a separate reference is the base
    # colocated on torch, the reference is the actor's base with the adapter off: no second model
    assert role_aliases(cfg) == {"ref": "train"}
    own_group = typed(f"{M}.lora_rank=16", "placement.colocate_groups=[[train,rollout]]")
    assert role_aliases(own_group) == {}
    # vLLM beside the trainer (the default placement): merged, an on-device copy without LoRA
    # kernels; on devices of its own: the adapters, the bytes that cross
    vllm = build_role_specs(typed(f"{M}.lora_rank=16", f"{R}.name=vllm", BF16), ["train"])["train"]
    assert vllm.lora.sync == "merged" and vllm.lora.target_modules == "all-linear"
    assert "shares the trainer's devices" in vllm.lora.sync_reason
    apart = build_role_specs(typed(f"{M}.lora_rank=16", f"{R}.name=vllm", BF16, *SEPARATE), ["train"])
    assert apart["train"].lora.sync == "adapter" and "cross devices" in apart["train"].lora.sync_reason
    # vLLM's LoRA kernels take 16-bit inputs only: an fp32 engine gets merged weights
    fp32 = build_role_specs(typed(f"{M}.lora_rank=16", f"{R}.name=vllm", *SEPARATE), ["train"])["train"]
    assert fp32.lora.sync == "merged" and "not float32" in fp32.lora.sync_reason
    given = build_role_specs(
        typed(f"{M}.lora_rank=16", f"{R}.name=vllm", BF16, f"{R}.lora_sync=adapter"), ["train"]
    )
    assert given["train"].lora.sync == "adapter" and given["train"].lora.sync_reason == ""


@pytest.mark.parametrize(
    "overrides,want",
    [
        (("tuner_type=lora",), (8, 32.0, 0.05)),  # ms-swift's defaults
        (("lora_rank=16", "tuner_type=lora"), (16, 32.0, 0.05)),  # a given key wins, in any order
        (("tuner_type=lora", "train.lora_alpha=64", "lora_dropout=0"), (8, 64.0, 0.0)),
        (("tuner_type=full",), (0, 16.0, 0.0)),
    ],
)
def test_ms_swift_tuner_type_and_lora_names(overrides, want):
    m = typed(*overrides).actor_rollout_ref.model
    assert (m.lora_rank, m.lora_alpha, m.lora_dropout) == want


@pytest.mark.parametrize(
    "overrides,key,says",
    [
        (("tuner_type=full", "lora_rank=4"), "tuner_type", "set tuner_type: lora"),
        (("tuner_type=lora", "lora_rank=0"), f"{M}.lora_rank", "rank > 0"),
        ((f"{M}.lora_rank=-1",), f"{M}.lora_rank", ">= 0"),
        ((f"{M}.lora_alpha=8",), f"{M}.lora_alpha", "LoRA is off"),
        ((f"{M}.lora_rank=8", f"{M}.target_modules=[q_proj,qkv_proj]"), f"{M}.target_modules", "'up_proj'"),
        ((f"{M}.lora_rank=8", f"{M}.target_modules=[lm_head]"), f"{M}.target_modules", "output layer"),
        ((f"{M}.lora_rank=8", MEGATRON, f"{M}.target_modules=[qkv]"), f"{M}.target_modules", "'down_proj'"),
        (
            (f"{M}.lora_rank=8", MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"),
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
            "one pipeline stage",
        ),
        ((f"{M}.lora_rank=8", f"{R}.lora_sync=adapter"), f"{R}.lora_sync", "hf rollout does not serve"),
        ((f"{M}.lora_rank=1024", f"{R}.name=vllm", BF16, ADAPTER), f"{M}.lora_rank", "up to rank 512"),
        (
            (f"{M}.lora_rank=8", f"{R}.name=vllm", BF16, ADAPTER, f"{R}.sleep_level=2"),
            f"{R}.sleep_level",
            "base weights",
        ),
        ((f"{M}.lora_rank=8", f"{R}.name=vllm", f"{R}.lora_sync=adapter"), f"{R}.lora_sync", "bf16/fp16"),
    ],
)
def test_refused_before_ray_naming_the_key(overrides, key, says):
    from dagrl.config.role_specs import role_spec
    from dagrl.config.roles import Role
    from dagrl.config.validate import check_role_rules

    with pytest.raises(ConfigError, match=says) as info:
        cfg = typed(*overrides)
        validate(cfg)
        check_role_rules(cfg, [role_spec(cfg, Role.rollout)])
    assert info.value.key == key


def test_auto_merged_beside_the_trainer_takes_what_an_adapter_sync_refuses():
    """Sleep level 2 and ranks above vLLM's LoRA limit: the merged sync resends the whole model."""
    from dagrl.config.role_specs import role_spec
    from dagrl.config.roles import Role
    from dagrl.config.validate import check_role_rules

    cfg = typed(f"{M}.lora_rank=1024", f"{R}.name=vllm", BF16, f"{R}.sleep_level=2")
    validate(cfg)
    check_role_rules(cfg, [role_spec(cfg, Role.rollout)])
    assert role_spec(cfg, Role.rollout).lora.sync == "merged"


def test_memory_plan_counts_a_frozen_base_and_bf16_adapters_with_fp32_masters():
    """Qwen3-8B's shape, rank 64 on every linear layer: 174.6M adapter parameters; the bf16 base's
    weights only, the adapters as trained weights of a bf16 model: 2 + 2 bytes (weights, gradients
    during the update) and 12 of fp32 master and Adam's moments."""
    from dagrl.backends.model_shape import ModelShape
    from dagrl.backends.torch.lora import adapter_params, merged_sync_bytes
    from dagrl.backends.torch.memory import between_updates, state_bytes
    from dagrl.config.roles import LoraSettings

    shape = ModelShape(4096, 36, 32, 8, 128, 12288, 151936, False, 8_190_735_360)
    lora = LoraSettings(rank=64, alpha=128.0)
    per_layer = (4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 12288) + (12288 + 4096)
    assert adapter_params(shape, lora) == 64 * per_layer * 36 == 174_587_904
    parts = state_bytes(shape, 2, trains=True, lora=lora)
    adapters = 174_587_904
    assert parts == {
        "weights": (shape.params + adapters) * 2,
        "grads": adapters * 2,
        "optimizer": adapters * 12,
    }
    kept = between_updates(parts, 2, optimizer_on_host=False)
    assert "grads" not in kept  # the masters take them at the step
    full = state_bytes(shape, 2, trains=True)
    assert sum(kept.values()) / 2**30 < 17.6 < sum(full.values()) / 2**30  # 17.5 GiB against 122 GiB
    # a merged sync makes the adapted weights: one 256 MiB bucket of them alive, and the largest
    # layer's (MLP, 12288 x 4096) fp32 B·A while it is folded in
    assert merged_sync_bytes(shape, lora, 2, 256 * 2**20) == 256 * 2**20 + 4 * 12288 * 4096
    fp32 = state_bytes(shape, 4, trains=True, lora=lora)  # fp32 adapters: stepped in place
    assert fp32["optimizer"] == adapters * 8 and fp32["grads"] == adapters * 4


def test_vllm_engine_is_started_for_the_adapter_it_will_get():
    from dagrl.backends.vllm.engine_args import adapter_peft_config, llm_kwargs

    adapter = typed(f"{M}.lora_rank=40", f"{R}.name=vllm", BF16, f"{R}.lora_sync=adapter")
    spec = build_role_specs(adapter, ["rollout"])["rollout"]
    kwargs = llm_kwargs(spec, "/m")
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 1, 64)
    assert adapter_peft_config(spec.lora) == {
        "r": 40,
        "lora_alpha": 16.0,
        "target_modules": "all-linear",
        "bias": "none",
    }
    merged = typed(f"{M}.lora_rank=40", f"{R}.name=vllm", BF16)  # auto beside the trainer
    assert "enable_lora" not in llm_kwargs(build_role_specs(merged, ["rollout"])["rollout"], "/m")


def test_megatron_memory_plan_counts_a_frozen_base_and_sharded_adapters():
    """The same shape on megatron: a fused layer's HF names share one A (q/k/v, gate/up), so
    146.3M adapter parameters against PEFT's 174.6M; at TP2 the split side
    of each fused layer halves (column-parallel B, row-parallel A); the main params and Adam's
    moments shard over DP under the distributed optimizer; the base has weights only."""
    from dagrl.backends.megatron.lora import adapter_params
    from dagrl.backends.megatron.memory import MegatronLayout, lora_state_bytes
    from dagrl.backends.model_shape import ModelShape
    from dagrl.config.roles import LoraSettings

    shape = ModelShape(4096, 36, 32, 8, 128, 12288, 151936, False, 8_190_735_360)
    lora = LoraSettings(rank=64, alpha=128.0)
    per_layer = (4096 + 6144) + (4096 + 4096) + (4096 + 2 * 12288) + (12288 + 4096)  # qkv, proj, fc1, fc2
    assert adapter_params(shape, lora) == 64 * 36 * per_layer == 146_276_352
    split = (4096 + 2 * 1024) + 4096 + 2 * 12288 + 12288  # qkv, proj, fc1, fc2 outputs / inputs
    assert adapter_params(shape, lora, tp=2) == 146_276_352 - 64 * 36 * split / 2
    parts = lora_state_bytes(shape, MegatronLayout(tp=2, dp=4, workers=8), "bfloat16", lora, True)
    adapters = adapter_params(shape, lora, tp=2)
    # bf16 adapters as megatron's bf16 params: fp32 main gradient, fp32 main param + m + v / DP
    assert parts == {"weights": shape.params + adapters * 2, "grads": adapters * 4, "optimizer": adapters * 3}
    fp32 = lora_state_bytes(shape, MegatronLayout(tp=2, dp=4, workers=8), "float32", lora, True)
    assert fp32["optimizer"] == adapters * 2  # fp32 adapters are their own main params
    assert adapter_params(
        shape, LoraSettings(rank=64, alpha=128.0, target_modules=("q_proj", "k_proj", "v_proj"))
    ) == 64 * 36 * (4096 + 6144)


def test_lora_follows_what_each_backend_registers(monkeypatch):
    """Whether a train backend applies LoRA and a rollout engine serves an adapter is the backend's
    own entry (its hooks' applies_lora, its lora_dtypes), not a list of names in config/: a plugin
    train backend without LoRA is refused naming those with it, and an engine registering 16-bit
    adapter serving gets the adapter sync (on devices of its own)."""
    from dataclasses import replace

    from dagrl.backends.registry import describe_backend, register_backend
    from dagrl.registry import BACKENDS

    # the plugins must not outlive this test (the registry lists every registered name)
    monkeypatch.setattr(BACKENDS, "entries", dict(BACKENDS.entries))
    monkeypatch.setattr(BACKENDS, "backends", dict(BACKENDS.backends))
    torch_hooks = BACKENDS.backend("torch").hooks
    register_backend("train", "plain_train", hooks=replace(torch_hooks, applies_lora=False))(object)
    with pytest.raises(ConfigError, match="strategy=megatron or torch") as e:
        validate(typed(f"{M}.lora_rank=8", "actor_rollout_ref.actor.strategy=plain_train"))
    assert e.value.key == f"{M}.lora_rank" and "plain_train train backend does not apply LoRA" in str(e.value)
    register_backend("rollout", "adapter_engine")(object)
    describe_backend("adapter_engine", lora_dtypes=("bfloat16",))
    served = typed(f"{M}.lora_rank=8", f"{R}.name=adapter_engine", BF16, *SEPARATE)
    assert build_role_specs(served, ["train"])["train"].lora.sync == "adapter"
