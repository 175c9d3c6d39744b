"""strategy=megatron: the rules of backends/megatron/rules.py, the memory estimate, and the launch script.

Models are config.json files only (validation and the estimate read the config and build on the meta
device), written by transformers into tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagrl.backends.megatron import probes
from dagrl.backends.pinned import pinned_bytes
from dagrl.config.keys import schema_keys
from dagrl.config.placement import format_plan, make_plan
from dagrl.config.validate import validate_with_plan
from dagrl.errors import ConfigError, DagrlError, PlacementError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config, main_in_process, validated_config

REPO = Path(__file__).resolve().parents[2]
A = "actor_rollout_ref.actor"
M = f"{A}.megatron"
REF = "actor_rollout_ref.ref"
TP, PP, VPP = (
    f"{M}.tensor_model_parallel_size",
    f"{M}.pipeline_model_parallel_size",
    f"{M}.virtual_pipeline_model_parallel_size",
)
CP, EP, ETP = (
    f"{M}.context_parallel_size",
    f"{M}.expert_model_parallel_size",
    f"{M}.expert_tensor_parallel_size",
)
SP = f"{M}.sequence_parallel"
R = "actor_rollout_ref.rollout"
DENSE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def qwen3_dir(directory: Path, **changes) -> str:
    """A Qwen3 config.json (8 layers, 4 heads, 2 KV heads, vocab 256 unless changed)."""
    from transformers import Qwen3Config

    Qwen3Config(**{**DENSE, **changes}).save_pretrained(directory)
    return str(directory)


def qwen3_moe_dir(directory: Path, **changes) -> str:
    """A Qwen3-MoE config.json with 8 experts of width 48 (every layer sparse)."""
    from transformers import Qwen3MoeConfig

    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1)
    Qwen3MoeConfig(**{**DENSE, **moe, **changes}).save_pretrained(directory)
    return str(directory)


def megatron(model: str, *overrides: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"{A}.optim.lr=1e-6",
        f"{A}.strategy=megatron",
        *overrides,
    ]


checked = validated_config


def expect_error(key: str, fix: str, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        checked(*overrides)
    assert info.value.key == key, str(info.value)
    assert key in str(info.value) and fix in str(info.value)
    return info.value


def planned(*overrides: str, roles=("train", "rollout")):
    """checked + placement on the declared cluster + validate_with_plan; returns (cfg, plan)."""
    cfg = checked(*overrides)
    plan = make_plan(cfg, set(roles), "cuda")
    validate_with_plan(cfg, plan)
    return cfg, plan


def expect_plan_error(key: str, fix: str, *overrides: str, roles=("train", "rollout")) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        planned(*overrides, roles=roles)
    assert info.value.key == key, str(info.value)
    assert fix in str(info.value)
    return info.value


@pytest.fixture
def model(tmp_path) -> str:
    return qwen3_dir(tmp_path / "qwen3")


@pytest.fixture
def no_te(monkeypatch):
    monkeypatch.setattr(probes, "transformer_engine_available", lambda: False)


@pytest.fixture
def with_te(monkeypatch):
    monkeypatch.setattr(probes, "transformer_engine_available", lambda: True)


# ---- knobs that need strategy=megatron -----------------------------------------------------------


@pytest.mark.parametrize(
    "key,value",
    [
        (TP, 2),
        (PP, 2),
        (VPP, 2),
        (CP, 2),
        (EP, 2),
        (ETP, 1),
        (SP, "true"),
        (f"{REF}.megatron.tensor_model_parallel_size", 2),
    ],
)
def test_torch_strategy_rejects_each_parallel_knob_by_name(key, value):
    expect_error(key, "strategy=megatron", f"{key}={value}")


def test_valid_megatron_config_passes(model):
    cfg = checked(*megatron(model, f"{TP}=2", f"{PP}=4"))
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 2


@pytest.mark.parametrize("value", ["cuda", "Triton"])
def test_logprob_kernel_override_must_be_known(model, monkeypatch, value):
    monkeypatch.setenv("DAGRL_LOGPROB_KERNEL", value)
    with pytest.raises(DagrlError, match=f"DAGRL_LOGPROB_KERNEL={value!r}: use 'torch' or 'triton'"):
        checked(*megatron(model))
    monkeypatch.setenv("DAGRL_LOGPROB_KERNEL", "torch")
    checked(*megatron(model))


# ---- sizes against the model ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"]
)
def test_sizes_below_one(model, key):
    expect_error(f"{M}.{key}", "must be >= 1", *megatron(model, f"{M}.{key}=0"))


def test_heads_must_split_over_tp(tmp_path):
    model = qwen3_dir(tmp_path, num_attention_heads=6, num_key_value_heads=6)
    exc = expect_error(TP, "num_attention_heads = 6", *megatron(model, f"{TP}=4"))
    assert exc.value == 4


def test_kv_heads_must_split_over_tp(model):
    expect_error(TP, "num_key_value_heads = 2", *megatron(model, f"{TP}=4"))


def test_odd_vocab_passes_tp2():
    # the shipped tiny model's 261 tokens are padded to 262 by the backend, not refused
    checked(f"{A}.strategy=megatron", f"{TP}=2")


def test_layers_must_split_over_pp(model):
    expect_error(PP, "8 layers", *megatron(model, f"{PP}=3"))


def test_layers_must_split_over_pp_times_vpp(model):
    expect_error(VPP, "PP × VPP = 12", *megatron(model, f"{PP}=4", f"{VPP}=3"))
    checked(*megatron(model, f"{PP}=4", f"{VPP}=2"))


def test_vpp_needs_pp(model):
    expect_error(VPP, "pipeline_model_parallel_size > 1", *megatron(model, f"{VPP}=2"))


def test_sequence_parallel_needs_tp(model):
    expect_error(SP, "tensor_model_parallel_size > 1", *megatron(model, f"{SP}=true"))
    checked(*megatron(model, f"{SP}=true", f"{TP}=2"))


def test_param_dtype(model):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as info:  # not a dtype at all: the command line refuses it
        compose_config(*megatron(model, f"{M}.param_dtype=fp8"))
    assert "param_dtype" in str(info.value) + str(info.value.__cause__)
    expect_error(f"{M}.param_dtype", "bfloat16", *megatron(model, f"{M}.param_dtype=bf16"))  # an alias
    checked(*megatron(model, f"{M}.param_dtype=float32"))


# ---- layer specs and TransformerEngine -----------------------------------------------------------


@pytest.mark.parametrize("te", ["no_te", "with_te"])
def test_context_parallel_refusal_says_what_is_missing(model, te, request):
    """CP > 1 is refused with or without TransformerEngine (the backend does not split sequences):
    the message must not send the user to install TransformerEngine."""
    request.getfixturevalue(te)
    error = expect_error(CP, "does not split sequences", *megatron(model, f"{CP}=2"))
    assert "install" not in str(error)
    doc = schema_keys()[CP].doc  # --help says so too, and does not send the user to layer_spec=te
    assert "refused on every machine" in doc and "layer_spec" not in doc


def test_gradient_checkpointing_is_megatron_recompute(model):
    """verl's (enable_)gradient_checkpointing under strategy=megatron: full recompute unless set."""
    cfg = checked(*megatron(model, "actor_rollout_ref.model.gradient_checkpointing=true"))
    m = cfg.actor_rollout_ref.actor.megatron
    assert (m.recompute_granularity.value, m.recompute_method.value, m.recompute_num_layers) == (
        "full",
        "uniform",
        1,
    )
    cfg = checked(
        *megatron(
            model,
            "actor_rollout_ref.model.gradient_checkpointing=true",
            f"{M}.recompute_granularity=selective",
        )
    )
    assert cfg.actor_rollout_ref.actor.megatron.recompute_granularity.value == "selective"
    doc = schema_keys()["actor_rollout_ref.model.gradient_checkpointing"].doc  # --help says so too
    assert "megatron: full recompute" in doc


def test_te_layer_spec_needs_transformer_engine(model, no_te):
    expect_error(f"{M}.layer_spec", "not installed", *megatron(model, f"{M}.layer_spec=te"))


def test_local_spec_has_no_sequence_parallel(model):
    expect_error(SP, "local layer spec", *megatron(model, f"{SP}=true", f"{TP}=2", f"{M}.layer_spec=local"))


# ---- experts -------------------------------------------------------------------------------------


def test_expert_parallel_needs_experts(model):
    expect_error(EP, "no experts", *megatron(model, f"{EP}=2"))
    expect_error(ETP, "no experts", *megatron(model, f"{ETP}=1"))


def test_experts_must_split_over_ep(tmp_path):
    model = qwen3_moe_dir(tmp_path, num_experts=6)
    expect_error(EP, "6 experts", *megatron(model, f"{EP}=4"))
    checked(*megatron(model, f"{EP}=2"))


def test_expert_tp_must_split_expert_width(tmp_path):
    model = qwen3_moe_dir(tmp_path, moe_intermediate_size=36)
    expect_error(ETP, "moe_intermediate_size = 36", *megatron(model, f"{ETP}=8"))
    expect_error(ETP, "must be >= 1", *megatron(model, f"{ETP}=0"))


def test_expert_groups_must_fit_the_devices(tmp_path):
    model = qwen3_moe_dir(tmp_path)
    base = megatron(
        model, "trainer.n_gpus_per_node=4", "data.train_batch_size=8", f"{A}.ppo_mini_batch_size=8"
    )
    # TP 2 × EP 4 = 8 ranks per expert group, but only 4 devices
    expect_plan_error(EP, "EP × expert TP = 8", *base, f"{TP}=2", f"{EP}=4")
    # expert TP 1 × EP 4 fits beside TP 2 × DP 2
    _, plan = planned(*base, f"{TP}=2", f"{EP}=4", f"{ETP}=1")
    assert plan.roles["train"].dp == 2


# ---- recompute -----------------------------------------------------------------------------------


def test_recompute_settings(model):
    from hydra.errors import ConfigCompositionException

    # closed sets are enums: the command line refuses other values, naming the key and the choices
    for key, bad, choices in (
        ("recompute_granularity", "some", "full"),
        ("recompute_method", "all", "uniform"),
    ):
        with pytest.raises(ConfigCompositionException) as info:
            compose_config(*megatron(model, f"{M}.{key}={bad}"))
        text = str(info.value) + str(info.value.__cause__)
        assert key in text and choices in text, text
    expect_error(
        f"{M}.recompute_method", "needs recompute_method", *megatron(model, f"{M}.recompute_granularity=full")
    )
    expect_error(
        f"{M}.recompute_num_layers",
        "layers per pipeline stage (4)",
        *megatron(model, f"{M}.recompute_granularity=full", f"{M}.recompute_method=uniform", f"{PP}=2"),
    )
    expect_error(
        f"{M}.recompute_method",
        "only used with recompute_granularity=full",
        *megatron(model, f"{M}.recompute_method=block"),
    )
    checked(*megatron(model, f"{M}.recompute_granularity=selective"))
    checked(
        *megatron(
            model,
            f"{M}.recompute_granularity=full",
            f"{M}.recompute_method=block",
            f"{M}.recompute_num_layers=2",
        )
    )


# ---- DP and batch sizes --------------------------------------------------------------------------


def test_devices_must_be_a_multiple_of_model_parallel(model):
    cfg = checked(*megatron(model, "trainer.n_gpus_per_node=6", f"{TP}=2", f"{PP}=2"))
    with pytest.raises(PlacementError, match="TP×PP×CP = 2×2×1"):
        make_plan(cfg, {"train", "rollout"}, "cuda")


def test_dp_counts_only_data_parallel_ranks(model):
    _, plan = planned(*megatron(model, "trainer.n_gpus_per_node=8", f"{TP}=2", f"{PP}=2"))
    assert (plan.roles["train"].dp, plan.roles["rollout"].dp) == (2, 8)


def test_mini_batch_must_split_over_megatron_dp(model):
    # TP 2 on 8 devices: DP 4; a mini-batch of 1 prompt × 2 responses cannot split over 4 ranks
    expect_plan_error(
        f"{A}.ppo_mini_batch_size",
        "DP = 4",
        *megatron(model, "trainer.n_gpus_per_node=8", f"{TP}=2", f"{R}.n=2", f"{A}.ppo_mini_batch_size=1"),
    )


def test_vpp_needs_micro_batches_in_multiples_of_pp(model):
    base = megatron(
        model,
        "trainer.n_gpus_per_node=4",
        f"{PP}=4",
        f"{VPP}=2",
        "data.train_batch_size=8",
        f"{A}.ppo_mini_batch_size=4",
        f"{R}.n=4",
        f"{R}.log_prob_micro_batch_size_per_gpu=8",  # 32 rows per rank → 4 micro-batches
    )
    # DP 1: a mini-batch is 16 responses; micro-batches of 8 make 2, not a multiple of PP 4
    exc = expect_plan_error(
        f"{A}.ppo_micro_batch_size_per_gpu",
        "PP = 4 micro-batches (now 2)",
        *base,
        f"{A}.ppo_micro_batch_size_per_gpu=8",
    )
    assert exc.value == 8
    planned(*base, f"{A}.ppo_micro_batch_size_per_gpu=4")
    expect_plan_error(
        f"{R}.log_prob_micro_batch_size_per_gpu",
        "(now 2)",
        *base,
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        f"{R}.log_prob_micro_batch_size_per_gpu=16",
    )


def test_ref_rows_must_split_over_ref_dp(model):
    # ref on 3 separate devices: 16 × 8 = 128 rows do not split over DP 3
    cfg = checked(
        *megatron(
            model,
            "trainer.n_gpus_per_node=5",
            "placement.colocate_groups=[[train,rollout],[ref]]",
            "placement.gpus.ref=3",
            f"{A}.use_kl_loss=true",
        )
    )
    plan = make_plan(cfg, {"train", "rollout", "ref"}, "cuda")
    with pytest.raises(ConfigError, match="role 'ref'") as info:
        validate_with_plan(cfg, plan)
    assert info.value.key == "data.train_batch_size"


# ---- the reference model -------------------------------------------------------------------------


def test_ref_copies_the_actor_parallel_settings(model):
    cfg = checked(
        *megatron(
            model,
            f"{TP}=2",
            f"{PP}=2",
            f"{SP}=true",
            f"{M}.layer_spec=sdpa",
            f"{M}.param_dtype=float32",
            f"{REF}.megatron.param_offload=true",  # not a parallel setting: the ref still inherits
        )
    )
    ref = cfg.actor_rollout_ref.ref.megatron
    assert (ref.tensor_model_parallel_size, ref.pipeline_model_parallel_size, ref.sequence_parallel) == (
        2,
        2,
        True,
    )
    assert (ref.layer_spec.value, ref.param_dtype, ref.param_offload) == ("sdpa", "float32", True)


def test_colocated_ref_must_match_actor_sizes(model):
    exc = expect_error(
        f"{REF}.megatron.tensor_model_parallel_size",
        "placement=separate",
        *megatron(
            model,
            f"{TP}=2",
            f"{REF}.megatron.tensor_model_parallel_size=1",
            f"{REF}.megatron.pipeline_model_parallel_size=2",
        ),
    )
    assert "colocated" in str(exc)


def test_ref_on_its_own_devices_may_differ(model):
    cfg = checked(
        *megatron(
            model,
            "placement.colocate_groups=[[train,rollout],[ref]]",
            f"{TP}=2",
            f"{REF}.megatron.pipeline_model_parallel_size=2",
        )
    )
    ref = cfg.actor_rollout_ref.ref.megatron
    assert (ref.tensor_model_parallel_size, ref.pipeline_model_parallel_size) == (1, 2)


# ---- memory estimate -----------------------------------------------------------------------------


def dense_params(c: dict) -> int:
    """Qwen3 parameter count by hand: untied embedding and head, q/k norms, SwiGLU MLP, 2 norms a layer."""
    h, hd, v = c["hidden_size"], c["head_dim"], c["vocab_size"]
    attn = h * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"]) + 2 * hd
    layer = attn + 3 * h * c["intermediate_size"] + 2 * h
    return 2 * v * h + c["num_hidden_layers"] * layer + h


def end_stage(c: dict, tp: int, pp: int) -> float:
    """Parameters on one device of an end pipeline stage: the layers split evenly over PP, the
    embedding on the first stage and the (untied) output layer on the last, all split over TP."""
    vocab = c["vocab_size"] * c["hidden_size"]
    return ((dense_params(c) - 2 * vocab) / pp + vocab) / tp


def estimate(model: str, *overrides: str):
    prepared = prepare(
        compose_config(
            *megatron(
                model, "trainer.device=cuda", "trainer.dry_run=true", "trainer.n_gpus_per_node=8", *overrides
            )
        )
    )
    return prepared.plan


def test_memory_estimate_by_hand(model):
    params, gib = dense_params(DENSE), 2**30
    # TP 2 × PP 4, DP 1: bf16 weights 2 B + fp32 grads 4 B + fp32 master, m, v 12 B on an end
    # stage's device (a quarter of the layers and a vocabulary matrix, over 2)
    stage = end_stage(DENSE, 2, 4)
    assert stage > params / 8
    plan = estimate(model, f"{TP}=2", f"{PP}=4", f"{M}.grad_offload=false")
    assert plan.memory_gib["train"] == pytest.approx(stage * 18 / gib)
    # by default the gradient buffers are freed while another role has the device: freed, not
    # copied, so they are no host bytes either (the next update zeroes them)
    plan = estimate(model, f"{TP}=2", f"{PP}=4")
    assert plan.memory_gib["train"] == pytest.approx(stage * 14 / gib)
    assert "train" not in plan.offloaded_gib
    # TP 2 × PP 2, DP 2: the distributed optimizer halves the 12 B (two stages of an untied model
    # hold half of it each: a vocabulary matrix at each end)
    assert end_stage(DENSE, 2, 2) == params / 4
    plan = estimate(model, f"{TP}=2", f"{PP}=2", f"{M}.grad_offload=false")
    assert plan.memory_gib["train"] == pytest.approx(params / 4 * (2 + 4 + 6) / gib)
    plan = estimate(
        model,
        f"{TP}=2",
        f"{PP}=2",
        f"{M}.use_distributed_optimizer=false",
        f"{M}.param_dtype=float32",
        f"{M}.grad_offload=false",
    )
    assert plan.memory_gib["train"] == pytest.approx(params / 4 * (4 + 4 + 8) / gib)


def test_offload_moves_memory_to_host_and_the_plan_says_so(model):
    stage, gib = end_stage(DENSE, 2, 4), 2**30  # an end stage's device: the largest
    sizes = (f"{TP}=2", f"{PP}=4")
    plan = estimate(
        model, *sizes, f"{M}.optimizer_offload=true", f"{M}.grad_offload=true", f"{A}.use_kl_loss=true"
    )
    assert plan.memory_gib["train"] == pytest.approx(stage * 2 / gib)
    assert plan.offloaded_gib["train"] == pytest.approx(stage * 12 / gib)  # the optimizer, copied
    assert plan.memory_gib["ref"] == pytest.approx(stage * 2 / gib)  # the ref holds weights only
    text = format_plan(plan)
    assert "train: 8 workers, DP=1 TP=2 PP=4 CP=1" in text
    assert "GiB/device offloaded to host memory between phases" in text
    # the ref's offload is its own setting (only parallel settings are copied from the actor)
    plan = estimate(model, *sizes, f"{REF}.megatron.param_offload=true", f"{A}.use_kl_loss=true")
    assert plan.memory_gib["ref"] == 0
    # its weights in HostStore's pinned slabs: their bytes, padded as megatron's buffers are (less
    # than 1 MiB here), in a slab of a power of two
    weights = int(stage * 2)
    assert weights / gib < plan.offloaded_gib["ref"] <= pinned_bytes([weights + 2**20], split=True) / gib
    assert "train" not in plan.offloaded_gib  # its gradient buffers are freed, not copied


def test_memory_estimate_splits_experts_over_ep(tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = qwen3_moe_dir(tmp_path)
    with torch.device("meta"):
        named = list(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).named_parameters())
    experts = sum(p.numel() for n, p in named if ".experts." in n)
    dense = sum(p.numel() for _, p in named) - experts
    assert experts == 8 * 8 * 3 * 64 * 48  # layers × experts × (gate, up, down) × hidden × width
    # 8 devices, DP 8; experts over EP 8 (expert DP 1): weights + grads + (12 B / DP) each
    plan = estimate(
        model, f"{EP}=8", "data.train_batch_size=8", f"{A}.ppo_mini_batch_size=8", f"{M}.grad_offload=false"
    )
    expected = dense * (6 + 12 / 8) + experts / 8 * (6 + 12)
    assert plan.memory_gib["train"] == pytest.approx(expected / 2**30)


# ---- the launch script ---------------------------------------------------------------------------


def write_gsm8k_like(directory: Path) -> tuple[str, str]:
    from dagrl.data import write_parquet

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(128)  # the script's default data.train_batch_size: the dry run checks the rows
    ]
    train, val = str(directory / "train.parquet"), str(directory / "test.parquet")
    write_parquet(rows, train)
    write_parquet(rows, val)
    return train, val


def run_script(tmp_path: Path, capsys, env: dict[str, str], *args: str) -> tuple[int, str]:
    """run_scripts/run_qwen3-8b-megatron.sh with DRY_RUN=1: the command it builds, planned in process."""
    from tests.launch_scripts import dagrl_argv

    train, val = write_gsm8k_like(tmp_path)
    full_env = {**os.environ, "TRAIN_FILE": train, "VAL_FILE": val, "DRY_RUN": "1", **env}
    argv = dagrl_argv(["bash", str(REPO / "run_scripts/run_qwen3-8b-megatron.sh"), *args], full_env, tmp_path)
    return main_in_process(capsys, *argv)


def test_script_dry_run_plans_tp2_pp4(tmp_path, capsys):
    small = {
        "MODEL_PATH": qwen3_dir(tmp_path / "model"),
        "TRAIN_BATCH_SIZE": "8",
        "PPO_MINI_BATCH_SIZE": "4",
        "PPO_MICRO_BATCH_SIZE_PER_GPU": "4",
        "LOG_PROB_MICRO_BATCH_SIZE_PER_GPU": "8",
        "ROLLOUT_N": "4",
        "MAX_PROMPT_LENGTH": "32",
        "MAX_RESPONSE_LENGTH": "8",
        "VPP": "2",
    }
    code, out = run_script(tmp_path, capsys, small, "trainer.seed=7")
    assert code == 0, out
    assert "cluster: 1 node(s) × 8 GPU(s), 8 used" in out
    assert "train: 8 workers, DP=1 TP=2 PP=4 CP=1" in out
    assert "ref: 8 workers, DP=1 TP=2 PP=4 CP=1" in out
    assert "rollout: 8 workers, DP=4 TP=2" in out  # vLLM rollout at TP 2 by default
    assert "dry run: plan printed, no workers started" in out


def test_script_runs_with_the_hf_rollout(tmp_path, capsys):
    """ROLLOUT_NAME=hf (the script's documented CPU/one-model-per-GPU rollout): no vLLM-only key
    goes on the command line, which dagrl would refuse beside the hf rollout."""
    small = {
        "MODEL_PATH": qwen3_dir(tmp_path / "model"),
        "TRAIN_BATCH_SIZE": "8",
        "PPO_MINI_BATCH_SIZE": "8",
        "ROLLOUT_N": "2",
        "MAX_PROMPT_LENGTH": "32",
        "MAX_RESPONSE_LENGTH": "8",
        "PP": "2",
        "N_GPUS_PER_NODE": "4",
        "ROLLOUT_NAME": "hf",
    }
    code, out = run_script(tmp_path, capsys, small)
    assert code == 0, out
    assert "train: 4 workers, DP=1 TP=2 PP=2 CP=1" in out
    assert "rollout: 4 workers, DP=4 TP=1" in out and "rollout engine hf" in out


def test_script_defaults_fit_a_qwen3_8b_config(tmp_path, capsys):
    """The script's defaults pass every rule for Qwen3-8B's shape (config.json only, nothing loaded)."""
    shape = dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
    from transformers import Qwen3Config

    Qwen3Config(**shape).save_pretrained(tmp_path / "qwen3-8b")
    code, out = run_script(tmp_path, capsys, {"MODEL_PATH": str(tmp_path / "qwen3-8b")})
    assert code == 0, out
    assert "train: 8 workers, DP=1 TP=2 PP=4 CP=1" in out


def test_megatron_on_cpu_needs_gpus_outside_the_test_patch(monkeypatch):
    """Without the tests' CPU patch, megatron on a CPU device is refused before Ray starts."""
    from dagrl.backends import registry
    from dagrl.errors import ConfigError
    from dagrl.trainer.setup import prepare

    registry.backend_names("train")  # the built-ins (and their device limits) are registered
    monkeypatch.setattr(registry.BACKENDS.backend("megatron"), "devices", {"cuda"})
    cfg = compose_config("actor_rollout_ref.actor.strategy=megatron", "trainer.device=cpu")
    with pytest.raises(ConfigError) as exc:
        prepare(cfg)
    assert exc.value.key == "trainer.device" and "strategy=torch" in str(exc.value)
