"""The vLLM rollout's CPU-testable parts: config rules, engine/sampling argument mapping, and the
conversion between padded tensors and vLLM's per-request token lists. The engine itself runs in
the gpu-marked tests beside this file."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.memory import share_of_card
from dagrl.backends.vllm.convert import prompt_token_lists, responses_to_tensors
from dagrl.backends.vllm.engine_args import RESERVED_ENGINE_KWARGS, llm_kwargs, max_model_len, sampling_kwargs
from dagrl.backends.vllm.rules import check_rollout_device
from dagrl.config.role_specs import role_spec
from dagrl.config.validate import resolve_defaults, validate
from dagrl.errors import ConfigError, PlacementError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config

R = "actor_rollout_ref.rollout"
VLLM = f"{R}.name=vllm"


def rollout_spec(cfg):
    return role_spec(cfg, "rollout")


def checked(*overrides):
    cfg = compose_config(*overrides)
    resolve_defaults(cfg)
    validate(cfg)
    return cfg


def config_error(*overrides) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        checked(*overrides)
    return info.value


def test_verl_keys_compose_and_map_onto_the_engine():
    cfg = checked(
        VLLM,
        f"{R}.tensor_model_parallel_size=2",
        f"{R}.gpu_memory_utilization=0.6",
        f"{R}.max_num_batched_tokens=8192",
        f"{R}.max_num_seqs=512",
        f"{R}.enforce_eager=true",
        f"{R}.free_cache_engine=false",
        f"{R}.enable_chunked_prefill=false",
        f"{R}.load_format=auto",
        "actor_rollout_ref.model.dtype=bfloat16",
        f"+{R}.engine_kwargs.vllm.kv_cache_dtype=fp8",
    )
    kw = llm_kwargs(rollout_spec(cfg), "/models/m")
    assert kw["model"] == "/models/m" and kw["dtype"] == "bfloat16"
    assert kw["tensor_parallel_size"] == 2 and kw["gpu_memory_utilization"] == 0.6
    assert kw["max_num_batched_tokens"] == 8192 and kw["max_num_seqs"] == 512
    assert kw["enforce_eager"] is True and kw["enable_chunked_prefill"] is False
    assert kw["enable_sleep_mode"] is False  # free_cache_engine=false: the engine never sleeps
    assert kw["max_model_len"] == cfg.data.max_prompt_length + cfg.data.max_response_length
    assert kw["logprobs_mode"] == "processed_logprobs"  # temperature reflected in the log-probs
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["kv_cache_dtype"] == "fp8"  # engine_kwargs.vllm passed through
    # each Ray worker sees one GPU: vLLM's custom all-reduce cannot map its TP peers (seen failing)
    assert kw["disable_custom_all_reduce"] is True


def test_unset_engine_sizes_are_left_to_vllm():
    kw = llm_kwargs(rollout_spec(checked(VLLM)), "/m")
    assert "max_num_batched_tokens" not in kw and "max_num_seqs" not in kw


def test_max_model_len_below_prompt_plus_response_is_refused(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # 4096 is past the tiny model's 64 positions
    exc = config_error(
        VLLM, "data.max_prompt_length=100", "data.max_response_length=50", f"{R}.max_model_len=120"
    )
    assert exc.key == f"{R}.max_model_len" and "= 150" in str(exc)
    cfg = checked(
        VLLM, "data.max_prompt_length=100", "data.max_response_length=50", f"{R}.max_model_len=4096"
    )
    assert max_model_len(rollout_spec(cfg)) == 4096


@pytest.mark.parametrize(
    "key", ["tensor_parallel_size", "gpu_memory_utilization", "seed", "enable_sleep_mode"]
)
def test_engine_kwargs_may_not_shadow_dagrl_keys(key):
    exc = config_error(VLLM, f"+{R}.engine_kwargs.vllm.{key}=1")
    assert exc.key == f"{R}.engine_kwargs.vllm.{key}"
    assert RESERVED_ENGINE_KWARGS[key] in str(exc)


def test_sleep_level_and_overlap_ranges():
    assert config_error(VLLM, f"{R}.sleep_level=3").key == f"{R}.sleep_level"
    assert config_error(f"{R}.overlap_steps=2").key == f"{R}.overlap_steps"


def test_dummy_weights_with_validation_before_training_is_refused():
    exc = config_error(VLLM, f"{R}.load_format=dummy")
    assert "val_before_train" in str(exc)
    checked(VLLM, f"{R}.load_format=dummy", "trainer.val_before_train=false")


def test_vllm_needs_a_gpu_unless_dry_run():
    cfg = checked(VLLM)
    with pytest.raises(ConfigError, match="vLLM needs GPUs"):
        check_rollout_device(cfg, "cpu")
    cfg.trainer.dry_run = True
    check_rollout_device(cfg, "cpu")  # a laptop may print the plan


def test_dry_run_plans_rollout_tp_on_a_declared_gpu_cluster():
    cfg = compose_config(
        VLLM,
        f"{R}.tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=4",
        "trainer.dry_run=true",
        "trainer.device=cuda",
    )
    plan = prepare(cfg).plan
    assert plan.roles["rollout"].tp == 2 and plan.roles["rollout"].dp == 2


def test_rollout_tp_must_divide_its_devices():
    cfg = compose_config(
        VLLM, f"{R}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=3", "trainer.dry_run=true"
    )
    with pytest.raises(PlacementError, match="not a multiple of TP"):
        prepare(cfg)


def test_overlap_needs_separate_placement():
    with pytest.raises(ConfigError) as info:
        prepare(compose_config(f"{R}.overlap_steps=1", "trainer.dry_run=true"))
    assert info.value.key == f"{R}.overlap_steps" and "placement=separate" in str(info.value)
    prepare(
        compose_config(
            f"{R}.overlap_steps=1", "placement=separate", "trainer.n_gpus_per_node=2", "trainer.dry_run=true"
        )
    )


def test_sampling_arguments_train_and_validation():
    cfg = checked(
        VLLM, f"{R}.temperature=0.7", f"{R}.top_p=0.9", f"{R}.top_k=20", f"{R}.val_kwargs.do_sample=false"
    )
    train = sampling_kwargs(rollout_spec(cfg), [5, 7], validate=False)
    assert (train["temperature"], train["top_p"], train["top_k"]) == (0.7, 0.9, 20)
    assert train["max_tokens"] == cfg.data.max_response_length and train["stop_token_ids"] == [5, 7]
    assert train["detokenize"] is False
    assert "logprobs" not in train  # auto: nothing in GRPO's step reads the engine's log-probs
    val = sampling_kwargs(rollout_spec(cfg), [5], validate=True)
    assert (val["temperature"], val["top_p"], val["top_k"]) == (0.0, 1.0, 0)  # greedy
    asked = sampling_kwargs(rollout_spec(checked(VLLM, f"{R}.calculate_log_probs=true")), [5], validate=False)
    assert asked["logprobs"] == 0 and asked["flat_logprobs"] is True  # the sampled token's only


def test_engine_logprobs_auto_asks_for_them_only_where_the_step_reads_them():
    """calculate_log_probs=null (the default) resolves before Ray: on for a rollout correction or the
    distill reward without the old-log-prob pass (which then reads them as the student's), off
    otherwise (vLLM's per-token log-probs cost ~45 % of a 32x8x256 rollout on an H200); false
    beside such a reader is refused, naming what reads them."""
    rc, on_policy = (
        "algorithm.rollout_correction",
        (f"{A}.ppo_mini_batch_size=16", "data.train_batch_size=16"),
    )
    assert compose_config(VLLM).actor_rollout_ref.rollout.calculate_log_probs is None
    assert checked(VLLM).actor_rollout_ref.rollout.calculate_log_probs is False
    assert checked(VLLM, f"{rc}.rollout_is=token").actor_rollout_ref.rollout.calculate_log_probs is True
    assert checked(VLLM, f"{rc}.rollout_rs=geometric").actor_rollout_ref.rollout.calculate_log_probs is True
    distill = (*on_policy, "algorithm.distill_reward.coef=0.5")
    assert checked(VLLM, *distill).actor_rollout_ref.rollout.calculate_log_probs is False  # the old pass runs
    no_pass = (*distill, f"{A}.recompute_old_logprobs=false")
    assert checked(VLLM, *no_pass).actor_rollout_ref.rollout.calculate_log_probs is True
    exc = config_error(VLLM, *no_pass, f"{R}.calculate_log_probs=false")
    assert exc.key == f"{R}.calculate_log_probs" and "distill_reward" in str(exc)
    assert (
        checked(VLLM, f"{R}.calculate_log_probs=true").actor_rollout_ref.rollout.calculate_log_probs is True
    )


def test_ignore_eos_lists_no_stop_ids():
    """vLLM stops at a listed stop id even with ignore_eos (it ignores only its own EOS): with
    ignore_eos the EOS ids are not listed, so responses run to max_tokens."""
    cfg = checked(VLLM, f"{R}.ignore_eos=true")
    for validation in (False, True):
        kwargs = sampling_kwargs(rollout_spec(cfg), [5, 7], validate=validation)
        assert kwargs["ignore_eos"] is True and kwargs["stop_token_ids"] == []


def test_prompts_lose_their_left_padding():
    prompts = torch.tensor([[0, 0, 11, 12], [21, 22, 23, 24]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_lists(prompts, mask) == [[11, 12], [21, 22, 23, 24]]


def test_responses_become_fixed_width_right_padded_tensors():
    responses, mask, logprobs = responses_to_tensors(
        [[5, 6, 2], [], [7]], [[-0.1, -0.2, -0.3], [], [-1.5]], 4, 0
    )
    assert responses.tolist() == [[5, 6, 2, 0], [0, 0, 0, 0], [7, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
    assert torch.allclose(logprobs, torch.tensor([[-0.1, -0.2, -0.3, 0], [0, 0, 0, 0], [-1.5, 0, 0, 0]]))
    _, _, none = responses_to_tensors([[5]], None, 2, 0)
    assert none.tolist() == [[0.0, 0.0]]


def test_a_response_longer_than_max_tokens_is_a_bug_not_truncated():
    with pytest.raises(AssertionError, match="more than max_tokens"):
        responses_to_tensors([[1, 2, 3]], None, 2, 0)


A = "actor_rollout_ref.actor"


def test_old_logprob_pass_is_skipped_only_on_policy():
    on_policy = (
        f"{A}.recompute_old_logprobs=false",
        f"{A}.ppo_mini_batch_size=16",
        "data.train_batch_size=16",
    )
    dag = prepare(compose_config(*on_policy, "trainer.dry_run=true")).dag
    names = {n.name for n in dag.nodes}
    assert "old_logprob" not in names and "actor_update" in names
    exc = config_error(
        f"{A}.recompute_old_logprobs=false", f"{A}.ppo_mini_batch_size=8", "data.train_batch_size=16"
    )
    assert exc.key == f"{A}.recompute_old_logprobs" and "on-policy" in str(exc)
    exc = config_error(*on_policy, f"{A}.ppo_epochs=2")
    assert exc.key == f"{A}.recompute_old_logprobs"
    exc = config_error(*on_policy, "algorithm.use_kl_in_reward=true")
    assert "use_kl_in_reward" in str(exc)


def test_rollout_correction_needs_rollout_logprobs_and_sane_thresholds():
    rc = "algorithm.rollout_correction"
    checked(f"{rc}.rollout_is=token", f"{rc}.rollout_rs=geometric", f"{rc}.rollout_rs_threshold=1.01")
    exc = config_error(VLLM, f"{R}.calculate_log_probs=false", f"{rc}.rollout_is=sequence")
    assert exc.key == f"{R}.calculate_log_probs" and "rollout_correction" in str(exc)
    assert config_error(f"{rc}.rollout_is_threshold=0").key == f"{rc}.rollout_is_threshold"
    exc = config_error(
        f"{rc}.rollout_rs=token", f"{rc}.rollout_rs_threshold=1.5", f"{rc}.rollout_rs_threshold_lower=2"
    )
    assert exc.key == f"{rc}.rollout_rs_threshold"


def test_greedy_training_rollout_is_vllm_temperature_zero():
    """temperature=0 trains greedily: vLLM gets 0 (argmax), the trainer scores at 1 (no 1/0)."""
    from dagrl.algos import logprob_temperature

    cfg = checked(VLLM, f"{R}.temperature=0", f"{R}.top_p=0.9", f"{R}.top_k=20")
    train = sampling_kwargs(rollout_spec(cfg), [5], validate=False)
    assert (train["temperature"], train["top_p"], train["top_k"]) == (0.0, 1.0, 0)
    assert logprob_temperature(cfg.actor_rollout_ref.rollout.temperature) == 1.0
    assert logprob_temperature(0.7) == 0.7


def test_context_past_the_models_positions_is_named_before_ray(monkeypatch):
    """vLLM refuses max_model_len > max_position_embeddings after Ray started (a pydantic traceback);
    the rule names the lengths first (the shipped tiny model has 64 positions)."""
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    exc = config_error("actor_rollout_ref.rollout.name=vllm", "data.max_response_length=48")
    assert exc.key == "data.max_response_length" and "max_position_embeddings (64)" in str(exc)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    prepare(
        compose_config(
            "actor_rollout_ref.rollout.name=vllm", "data.max_response_length=48", "trainer.dry_run=true"
        )
    )


def test_the_engines_share_is_of_the_card_the_plan_counted():
    """trainer.gpu_memory_gib below the GPU's size (a shared GPU, an 80 GiB card on a 141 GiB one):
    vLLM takes its share of the whole device, so the share shrinks to the bytes the plan counted;
    a figure above the device's (the plan's check overridden) leaves the share as set."""
    share = share_of_card(0.5, 79.2, 139.8)
    assert share == 0.2833
    assert share * 139.8 == pytest.approx(0.5 * 79.2, rel=1e-3)
    assert share_of_card(0.85, 139.8, 139.8) == 0.85
    assert share_of_card(0.5, 4096, 79.2) == 0.5
    cfg = checked(VLLM, "trainer.gpu_memory_gib=79.2", "trainer.dry_run=true")
    assert rollout_spec(cfg).card_gib == 79.2  # what start_engine scales the share by, on the worker
    assert rollout_spec(checked(VLLM)).card_gib is None  # the GPU's own size: the share as set
