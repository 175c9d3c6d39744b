"""ms-swift / verl keys that keep their meaning on every backend (or are refused naming why), and plans
that use every declared device or say why not."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dagrl.backends.vllm.engine_args import llm_kwargs
from dagrl.config.placement import format_plan, make_plan
from dagrl.config.role_specs import build_role_specs
from dagrl.config.roles import rollout_dtype
from dagrl.config.validate import resolve_defaults
from dagrl.errors import ConfigError, PlacementError
from dagrl.main import compose

A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"


def typed(*overrides: str):
    return OmegaConf.to_object(compose(list(overrides)))


def test_offload_keys_follow_the_train_backend():
    torch_cfg = typed("offload_model=false", "offload_optimizer=false")
    assert torch_cfg.actor_rollout_ref.actor.offload is False
    m = typed(
        f"{A}.strategy=megatron", "offload_model=true", "offload_optimizer=true"
    ).actor_rollout_ref.actor
    assert (m.megatron.param_offload, m.megatron.grad_offload, m.megatron.optimizer_offload) == (
        True,
        True,
        True,
    )
    with pytest.raises(ConfigError, match="offloads weights and optimizer state together") as info:
        typed("offload_model=true", "offload_optimizer=false")
    assert info.value.key == "offload_optimizer"


def test_keys_whose_meaning_follows_the_algorithm():
    gkd = typed("algorithm=gkd", "beta=0.3", "temperature=0.7")
    assert gkd.algorithm.gkd.beta == 0.3 and gkd.algorithm.gkd.temperature == 0.7
    assert gkd.actor_rollout_ref.rollout.temperature == 0.7
    grpo = typed("beta=0.04", "temperature=0.7")
    assert grpo.actor_rollout_ref.actor.use_kl_loss and grpo.actor_rollout_ref.actor.kl_loss_coef == 0.04
    assert grpo.actor_rollout_ref.rollout.temperature == 0.7 and grpo.algorithm.gkd.temperature == 1.0


def test_batch_sizes_count_completions_as_ms_swift_does():
    cfg = typed("num_generations=8", "global_batch_size=64", "steps_per_generation=4")
    assert (cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.data.train_batch_size) == (8, 32)
    assert typed("steps_per_generation=2", f"{A}.ppo_mini_batch_size=4").data.train_batch_size == 8
    with pytest.raises(ConfigError, match="multiple of num_generations") as info:
        typed("num_generations=8", "global_batch_size=12")
    assert info.value.key == "global_batch_size"


def test_a_dagrl_key_given_later_wins_over_an_ms_swift_one():
    cfg = typed("temperature=0.7", f"{R}.temperature=0.9")
    assert cfg.actor_rollout_ref.rollout.temperature == 0.9
    assert typed(f"{R}.temperature=0.9", "temperature=0.7").actor_rollout_ref.rollout.temperature == 0.7


def test_plain_aliases():
    cfg = typed(
        "model=/models/student",
        "max_length=512",
        "padding_free=true",
        "tensor_model_parallel_size=2",
        "external_plugins=my_plugin.py",
        "torch_dtype=bfloat16",
    )
    assert cfg.actor_rollout_ref.model.path == "/models/student" and cfg.data.max_prompt_length == 512
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 2
    assert cfg.external_plugins == ["my_plugin.py"] and cfg.actor_rollout_ref.model.dtype.value == "bfloat16"


def test_engine_kwargs_given_as_json_on_the_command_line():
    # what bash hands over for teacher.vllm_engine_kwargs='{"max_logprobs": 64}'
    cfg = typed(
        'teacher.vllm_engine_kwargs={"max_logprobs": 64}', 'vllm_engine_kwargs={"kv_cache_dtype": "fp8"}'
    )
    assert cfg.teacher.engine_kwargs == {"max_logprobs": 64}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm == {"kv_cache_dtype": "fp8"}


@pytest.mark.parametrize(
    "override,says",
    [
        ("min_lr=1e-7", "constant after warm-up"),
        ("lr_warmup_fraction=0.05", "lr_warmup_steps"),
        ("tuner_type=qlora", "full or lora"),
        ("dataset=AI-ModelScope/x#2000", "data.train_files"),
        ("logging_steps=5", "logs every step"),
    ],
)
def test_ms_swift_keys_dagrl_cannot_honour_are_refused_naming_them(override, says):
    with pytest.raises(ConfigError, match=says) as info:
        typed(override)
    assert info.value.key == override.split("=")[0]


def test_rollout_weights_follow_the_trainers_compute_dtype():
    siirl = typed(f"{A}.strategy=megatron", f"{A}.megatron.param_dtype=bfloat16")  # model.dtype: fp32
    assert (
        rollout_dtype(siirl) == "bfloat16"
        and llm_kwargs(build_role_specs(siirl, ["rollout"])["rollout"], "/m")["dtype"] == "bfloat16"
    )
    assert build_role_specs(siirl, ["rollout"])["rollout"].model.dtype == "bfloat16"
    assert rollout_dtype(typed(f"{A}.strategy=megatron", f"{R}.dtype=float32")) == "float32"
    assert rollout_dtype(typed(f"{M}.dtype=float16")) == "float16"


def test_nproc_per_node_needs_no_repeating():
    cfg = typed(
        "device_groups={nproc_per_node: 4, a: {ranks: [0, 1], workers: [train, ref]},"
        " b: {ranks: [2, 3], workers: [rollout]}}"
    )
    resolve_defaults(cfg)
    assert cfg.trainer.n_gpus_per_node == 4
    plan = make_plan(cfg, {"train", "rollout"}, "cuda")
    assert plan.total_slots == 4 and "idle" not in format_plan(plan)


def test_a_device_group_whose_roles_do_not_run_is_refused_naming_it():
    cfg = typed(
        "trainer.n_gpus_per_node=4",
        "device_groups={a: {ranks: [0, 1], workers: [train, rollout, ref]}, t: {ranks: [2, 3], workers: [teacher]}}",
    )
    with pytest.raises(PlacementError, match=r"placement.device_groups.t lists workers \['teacher'\]"):
        make_plan(cfg, {"train", "rollout"}, "cuda")


def test_the_plan_names_idle_devices():
    cfg = typed("train.gpus=4", "rollout.gpus=4", "trainer.n_gpus_per_node=8")
    text = format_plan(make_plan(cfg, {"train", "rollout"}, "cuda"))
    assert "idle: GPUs [4, 5, 6, 7] of the declared 1×8 run no role" in text
