"""Keys of verl, siiRL and ms-swift, applied to the raw command-line overrides before the schema merge.

One table, three kinds of entry (docs/compat.md renders it for users):

- `Alias`: the same concept under another name; the override is rewritten to dagrl's key.
- `OnlyValue`: dagrl implements one setting of the key (e.g. verl's `data.truncation=error`, which is
  what dagrl does with an over-long prompt it does not filter); that value is accepted with no
  effect, any other is refused.
- `Unsupported`: a concept dagrl does not have; refused with a one-line ConfigError saying what dagrl
  offers instead. A prefix entry covers every key below it (`actor_rollout_ref.actor.fsdp_config`).

Keys dagrl already has under the same name and meaning need no entry: they reach the schema as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dagrl.errors import ConfigError

A, R, REF, M = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)


@dataclass(frozen=True)
class Alias:
    target: str
    convert: Callable[[object], str] | None = None  # parsed value -> override value text (else kept)


@dataclass(frozen=True)
class OnlyValue:
    accepted: tuple  # parsed values that ask for what dagrl does anyway
    fix: str


@dataclass(frozen=True)
class Unsupported:
    fix: str


def _reward_terms(value: object) -> str:
    names = value if isinstance(value, list) else [value]
    return "[" + ",".join(f"{{name:{n},weight:1.0}}" for n in names) + "]"


def _rollout_name(value: object) -> str:
    return "vllm" if value in (True, "true", "True") else "hf"


_FSDP = (
    "dagrl's torch backend is data-parallel (DDP), not FSDP: offload is "
    f"{A}.offload (weights and optimizer state leave the GPU while other roles run); for sharding, "
    f"TP/PP and offload use {A}.strategy=megatron with {A}.megatron.* (param_offload, optimizer_offload, "
    "use_distributed_optimizer)"
)
_REF_FSDP = (
    f"dagrl's reference model follows the actor's backend: torch keeps it beside the actor, megatron "
    f"takes {REF}.megatron.* (param_offload, tensor/pipeline sizes)"
)
_NO_CRITIC = "dagrl has no critic (its algorithms, GRPO, Dr. GRPO, GSPO and GKD, need none); remove the key"
_PROFILER = "dagrl has no built-in profiler hooks; per-node seconds are the timing_s/<node> metrics"

TABLE: dict[str, Alias | OnlyValue | Unsupported] = {
    # ---- verl / siiRL: same concept, another name
    f"{M}.enable_gradient_checkpointing": Alias(f"{M}.gradient_checkpointing"),
    f"{A}.optim.clip_grad": Alias(f"{A}.grad_clip"),
    f"{R}.prompt_length": Alias("data.max_prompt_length"),
    f"{R}.response_length": Alias("data.max_response_length"),
    "custom_reward_function.name": Alias(
        "reward.functions", _reward_terms
    ),  # the file itself goes in external_plugins
    # ---- verl: one value is what dagrl does
    "data.truncation": OnlyValue(
        ("error",),
        "dagrl never truncates a prompt: it drops over-long ones (data.filter_overlong_prompts=true) or "
        "refuses them (false), which is verl's truncation=error",
    ),
    f"{A}.use_dynamic_bsz": OnlyValue(
        (False,), f"micro-batches are fixed: {A}.ppo_micro_batch_size_per_gpu responses each"
    ),
    f"{M}.use_shm": OnlyValue((False,), "models are read from their path"),
    f"{A}.megatron.use_dist_checkpointing": OnlyValue(
        (False,), "megatron starts from the HF weights at actor_rollout_ref.model.path"
    ),
    f"{REF}.megatron.use_dist_checkpointing": OnlyValue(
        (False,), "megatron starts from the HF weights at actor_rollout_ref.model.path"
    ),
    "trainer.balance_batch": OnlyValue((False,), "rows are split over DP ranks in order"),
    "trainer.val_only": OnlyValue((False,), "run with trainer.total_training_steps=... instead"),
    "algorithm.use_pf_ppo": OnlyValue((False,), "dagrl has no PF-PPO reweighting"),
    f"{R}.multi_turn.enable": OnlyValue((False,), "dagrl's rollout is single-turn"),
    # ---- verl: concepts dagrl does not have
    f"{A}.fsdp_config": Unsupported(_FSDP),
    f"{REF}.fsdp_config": Unsupported(_REF_FSDP),
    f"{A}.ppo_micro_batch_size": Unsupported(f"give the per-device size: {A}.ppo_micro_batch_size_per_gpu"),
    f"{R}.log_prob_micro_batch_size": Unsupported(
        f"give the per-device size: {R}.log_prob_micro_batch_size_per_gpu"
    ),
    f"{REF}.log_prob_micro_batch_size": Unsupported(
        f"give the per-device size: {REF}.log_prob_micro_batch_size_per_gpu"
    ),
    f"{A}.ppo_max_token_len_per_gpu": Unsupported(
        f"micro-batches count responses: {A}.ppo_micro_batch_size_per_gpu"
    ),
    f"{A}.ulysses_sequence_parallel_size": Unsupported(
        f"sequence splitting is megatron's context parallel: {A}.strategy=megatron "
        f"{A}.megatron.context_parallel_size"
    ),
    f"{A}.use_torch_compile": Unsupported("dagrl does not torch.compile the model; remove the key"),
    f"{A}.policy_loss": Unsupported(
        "the objective is chosen with the preset algorithm=grpo|dr_grpo|gspo|gkd (dagrl/objectives)"
    ),
    f"{A}.checkpoint": Unsupported(
        "checkpoints hold the model, optimizer and data state always; see trainer.save_freq"
    ),
    f"{A}.profiler": Unsupported(_PROFILER),
    f"{REF}.profiler": Unsupported(_PROFILER),
    f"{R}.profiler": Unsupported(_PROFILER),
    "global_profiler": Unsupported(_PROFILER),
    f"{A}.megatron.seed": Unsupported("trainer.seed seeds every role"),
    f"{REF}.megatron.seed": Unsupported("trainer.seed seeds every role"),
    f"{A}.megatron.override_transformer_config": Unsupported(
        f"recompute is {A}.megatron.recompute_granularity / recompute_method / recompute_num_layers; "
        "other transformer settings come from the HF config"
    ),
    f"{A}.megatron.use_mbridge": Unsupported("dagrl converts HF weights itself; remove the key"),
    f"{M}.use_remove_padding_in_ref": Unsupported(f"{M}.use_remove_padding covers every pass"),
    f"{M}.use_fused_kernels": Unsupported(
        "dagrl picks its log-prob kernel itself (Triton on CUDA; the environment variable "
        "DAGRL_LOGPROB_KERNEL=torch|triton forces one); remove the key"
    ),
    f"{M}.use_liger": Unsupported("dagrl does not patch models with Liger kernels; remove the key"),
    f"{M}.enable_activation_offload": Unsupported(
        f"use {M}.gradient_checkpointing (torch) or {A}.megatron.recompute_granularity"
    ),
    f"{M}.lora_rank": Unsupported("dagrl trains all weights (no LoRA yet)"),
    f"{M}.lora": Unsupported("dagrl trains all weights (no LoRA yet)"),
    f"{M}.external_lib": Unsupported("list the module in external_plugins"),
    f"{M}.override_config": Unsupported("model settings come from the HF config.json at the model path"),
    f"{R}.mode": Unsupported(
        "dagrl's rollout runs one engine per worker on whole batches; to sample the next batch while "
        f"this one trains use placement=separate {R}.overlap_steps=1"
    ),
    f"{R}.dtype": Unsupported(f"the rollout loads the weights in {M}.dtype"),
    f"{R}.multi_turn": Unsupported("dagrl's rollout is single-turn"),
    f"{R}.agent": Unsupported("dagrl's rollout is single-turn, without agent loops"),
    "data.return_raw_chat": Unsupported(
        "dagrl applies the chat template once in the data layer; rollouts receive token ids"
    ),
    "data.tokenizer": Unsupported("the tokenizer is the model's own (actor_rollout_ref.model.path)"),
    "data.dataloader_num_workers": Unsupported("rows are tokenized once at start; remove the key"),
    "data.custom_cls": Unsupported("data rows are parquet in verl's layout (docs/data.md)"),
    "trainer.critic_warmup": Unsupported(_NO_CRITIC),
    "critic": Unsupported(_NO_CRITIC),
    "trainer.max_critic_ckpt_to_keep": Unsupported(_NO_CRITIC),
    "reward_model": Unsupported(
        "dagrl's reward model is reward.model.* (enable, path, weight, micro_batch_size_per_gpu: a "
        "sequence-classification model on role rm); rule rewards are reward.functions"
    ),
    # ---- verl: reward model as a role (reward.model.*, dagrl/backends/reward_model.py)
    "reward_model.enable": Alias("reward.model.enable"),
    "reward_model.model.path": Alias("reward.model.path"),
    "reward_model.micro_batch_size_per_gpu": Alias("reward.model.micro_batch_size_per_gpu"),
    # ---- verl's SFT trainer (algorithm=sft): the same concepts under dagrl's keys
    "data.micro_batch_size_per_gpu": Alias(f"{A}.ppo_micro_batch_size_per_gpu"),
    "optim.lr": Alias(f"{A}.optim.lr"),
    "optim.weight_decay": Alias(f"{A}.optim.weight_decay"),
    "model.partial_pretrain": Alias(f"{M}.path"),
    "model.enable_gradient_checkpointing": Alias(f"{M}.gradient_checkpointing"),
    "use_remove_padding": Alias(f"{M}.use_remove_padding"),
    # ---- ms-swift's `swift sample` (pipeline=sample)
    "num_return_sequences": Alias(f"{R}.n"),
    "n_best_to_keep": Alias("sample.n_best_to_keep"),
    "sampler_type": Alias("sample.sampler_type"),
    "prm_model": Alias("sample.prm_model"),
    "orm_model": Alias("sample.orm_model"),
    "custom_reward_function.path": Unsupported(
        "put the file in external_plugins and name its function in reward.functions "
        "(verl's compute_score(...) and TRL's f(completions, **kwargs) forms both work)"
    ),
    "trainer.default_hdfs_dir": Unsupported("checkpoints go to trainer.default_local_dir"),
    "trainer.resume_from_path": Unsupported("give the global_step_N directory as trainer.resume_mode"),
    "trainer.log_val_generations": Unsupported("validation logs its reward and length metrics"),
    "ray_kwargs": Unsupported("dagrl starts Ray itself; join a cluster with trainer.ray_address=auto"),
    "ray_init": Unsupported("dagrl starts Ray itself; join a cluster with trainer.ray_address=auto"),
    # ---- ms-swift (Ray GRPO / GKD yaml keys, given as overrides): same concept, another name
    "colocate_groups": Alias("placement.colocate_groups"),
    "device_groups": Alias("placement.device_groups"),
    "num_generations": Alias(f"{R}.n"),
    "max_completion_length": Alias("data.max_response_length"),
    "num_train_epochs": Alias("trainer.total_epochs"),
    "train_iters": Alias("trainer.total_training_steps"),
    "lr": Alias(f"{A}.optim.lr"),
    "seed": Alias("trainer.seed"),
    "micro_batch_size": Alias(f"{A}.ppo_micro_batch_size_per_gpu"),
    "epsilon": Alias(f"{A}.clip_ratio"),
    "epsilon_high": Alias(f"{A}.clip_ratio_high"),
    "reward_funcs": Alias("reward.functions", _reward_terms),
    "use_vllm": Alias(f"{R}.name", _rollout_name),
    "sleep_level": Alias(f"{R}.sleep_level"),
    "teacher_model": Alias("teacher.model"),
    "offload_teacher_model": Alias("teacher.offload"),
    "gkd_logits_topk": Alias("algorithm.gkd.gkd_logits_topk"),
    "lmbda": Alias("algorithm.gkd.lmbda"),
    "sft_alpha": Alias("algorithm.gkd.sft_alpha"),
    "train.gpus": Alias("placement.gpus.train"),
    "rollout.gpus": Alias("placement.gpus.rollout"),
    "train.tensor_model_parallel_size": Alias(f"{A}.megatron.tensor_model_parallel_size"),
    "train.pipeline_model_parallel_size": Alias(f"{A}.megatron.pipeline_model_parallel_size"),
    "train.context_parallel_size": Alias(f"{A}.megatron.context_parallel_size"),
    "train.expert_model_parallel_size": Alias(f"{A}.megatron.expert_model_parallel_size"),
    "rollout.vllm_tensor_parallel_size": Alias(f"{R}.tensor_model_parallel_size"),
    "rollout.vllm_gpu_memory_utilization": Alias(f"{R}.gpu_memory_utilization"),
    "rollout.vllm_max_model_len": Alias(f"{R}.max_model_len"),
    "teacher.vllm_tensor_parallel_size": Alias("teacher.tensor_model_parallel_size"),
    "teacher.vllm_engine_kwargs": Alias("teacher.engine_kwargs"),
    # ---- ms-swift: ambiguous or missing here
    "beta": Unsupported(
        "ms-swift's beta is the KL weight in GRPO and the JSD mix in GKD: use "
        f"{A}.kl_loss_coef (with {A}.use_kl_loss=true) or algorithm.gkd.beta"
    ),
    "global_batch_size": Unsupported(
        f"dagrl counts prompts: data.train_batch_size per step and {A}.ppo_mini_batch_size per optimizer step"
    ),
    "tuner_type": Unsupported("dagrl trains all weights (no LoRA yet)"),
    "train.tuner_type": Unsupported("dagrl trains all weights (no LoRA yet)"),
    "offload_model": Unsupported(f"torch: {A}.offload; megatron: {A}.megatron.param_offload"),
    "offload_optimizer": Unsupported(f"torch: {A}.offload; megatron: {A}.megatron.optimizer_offload"),
}

# verl's root configs given with --config-name: dagrl has one root config, the strategy picks megatron.
CONFIG_NAMES = {
    "ppo_trainer": [],
    "ppo_megatron_trainer": [f"{A}.strategy=megatron"],
}


def lookup(key: str) -> tuple[str, Alias | OnlyValue | Unsupported] | None:
    """The table entry for `key`: its own, or that of the longest listed prefix (a whole section)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in TABLE:
            return prefix, TABLE[prefix]
    return None


def translate(overrides: list[str]) -> list[str]:
    """Overrides with every foreign key rewritten to dagrl's; refused keys raise ConfigError.

    `trainer.total_epochs` given without `trainer.total_training_steps` also sets the latter to null,
    so that epochs decide as in verl even though dagrl's default job (conf/config.yaml) stops at 40.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out = []
    for text in overrides:
        override = parser.parse_override(text)
        key = override.key_or_group
        found = None if override.is_delete() else lookup(key)
        if found is None:
            out.append(text)
            continue
        prefix, rule = found
        value = override.value()
        if isinstance(rule, Unsupported):
            raise ConfigError(key, value, f"not a dagrl setting: {rule.fix}")
        if isinstance(rule, OnlyValue):
            if value not in rule.accepted:
                ok = " or ".join(str(v) for v in rule.accepted)
                raise ConfigError(key, value, f"dagrl supports only {ok} here: {rule.fix}")
            continue  # asks for what dagrl does anyway
        target = rule.target + key[len(prefix) :]
        raw = text.split("=", 1)[1]
        out.append(f"{target}={rule.convert(value) if rule.convert else raw}")
    keys = {parser.parse_override(o).key_or_group for o in out}
    if "trainer.total_epochs" in keys and "trainer.total_training_steps" not in keys:
        out.append("trainer.total_training_steps=null")
    return out


def config_name_overrides(name: str) -> list[str]:
    """`--config-name <verl root config>` as overrides; another name is refused."""
    stem = name.removesuffix(".yaml")
    if stem not in CONFIG_NAMES:
        raise ConfigError(
            "--config-name",
            name,
            f"dagrl has one root config; accepted for verl scripts: {', '.join(CONFIG_NAMES)}",
        )
    return list(CONFIG_NAMES[stem])
