"""The table of verl's, siiRL's and ms-swift's keys (dagrl/config/compat.py applies it to the
raw command-line overrides; docs/compat.md renders it for users). Four kinds of entry:

- `Alias`: the same concept under another name; the override is rewritten to dagrl's key.
- `OnlyValue`: dagrl implements one setting of the key (e.g. verl's `data.truncation=error`, which is
  what dagrl does with an over-long prompt it does not filter); that value is accepted with no
  effect, any other is refused.
- `Unsupported`: a concept dagrl does not have; refused with a one-line ConfigError saying what dagrl
  offers instead. A prefix entry covers every key below it (`actor_rollout_ref.actor.fsdp_config`).
- `NoEffect`: a speed or bookkeeping knob of another framework with no counterpart that changes
  results here (ms-swift's `dataset_num_proc`); accepted, with a note saying why it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dagrl.config.override_text import render_value

A, R, REF, M = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)


LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "target_modules")


@dataclass(frozen=True)
class Alias:
    target: str
    convert: Callable[[object], str] | None = None  # parsed value -> override value text (else kept)
    entries: bool = False  # a mapping (or its JSON text) becomes one override per entry of target


@dataclass(frozen=True)
class OnlyValue:
    accepted: tuple  # parsed values that ask for what dagrl does anyway
    fix: str


@dataclass(frozen=True)
class Unsupported:
    fix: str


@dataclass(frozen=True)
class NoEffect:
    why: str


def _reward_terms(value: object) -> str:
    names = value if isinstance(value, list) else [value]
    return "[" + ",".join(f"{{name:{n},weight:1.0}}" for n in names) + "]"


def _log_probs_asked(value: object) -> str:
    return "true" if value else "null"


def _swift_rollout_is(value: object) -> str:
    """ms-swift's rollout_importance_sampling_mode: token_truncate is verl's and dagrl's token-level
    TIS (min(ratio, threshold) per token); its other modes have no exact counterpart here."""
    if value is None or value == "token_truncate":
        return "null" if value is None else "token"
    raise ValueError(
        "only token_truncate (= algorithm.rollout_correction.rollout_is=token) maps exactly: ms-swift's"
        " sequence modes take the geometric mean of the token ratios, dagrl's rollout_is=sequence their"
        " product, and its masks weight by the ratio below the threshold; set"
        " algorithm.rollout_correction.rollout_is=token|sequence and rollout_rs=token|sequence|geometric"
        " with rollout_rs_threshold (and _lower) instead (docs/vllm.md)"
    )


def _swift_loss_type(value: object) -> str:
    """ms-swift's (TRL's) loss_type as the aggregation it is: grpo averages each response's tokens
    then the responses, bnpo and dapo average every token of the batch, dr_grpo sums each response's
    tokens over the maximum response length."""
    modes = {
        "grpo": "seq-mean-token-mean",
        "bnpo": "token-mean",
        "dapo": "token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
    }
    if value not in modes:
        raise ValueError(
            f"dagrl has grpo, bnpo, dapo and dr_grpo ({A}.loss_agg_mode); other objectives are presets:"
            " algorithm=grpo|dr_grpo|gspo|dapo"
        )
    return modes[value]


def _swift_scale_rewards(value: object) -> str:
    """ms-swift's scale_rewards: group divides each advantage by its group's std, none does not."""
    if value in ("group", True):
        return "true"
    if value in ("none", False):
        return "false"
    raise ValueError(
        "dagrl divides by the group's std (group) or not at all (none); batch has no counterpart"
    )


def _swift_max_resample_times(value: object) -> str:
    """ms-swift counts the resamples after the first round, dagrl's cap every round."""
    if not isinstance(value, int) or value < 0:
        raise ValueError("give a count of resamples >= 0")
    return str(value + 1)


def _rollout_name(value: object) -> str:
    return "vllm" if value in (True, "true", "True") else "hf"


def _as_list(value: object) -> str:
    """ms-swift's `external_plugins: file.py` (one string) as dagrl's list."""
    items = value if isinstance(value, list) else [value]
    return "[" + ",".join(render_value(str(v)) for v in items) + "]"


def _zero_warmup(value: object) -> str:
    if value not in (0, 0.0):
        raise ValueError("dagrl counts warm-up in steps: set actor_rollout_ref.actor.optim.lr_warmup_steps")
    return "0"


_FSDP = (
    "dagrl's torch backend is data-parallel (DDP), not FSDP: offload is "
    f"{A}.offload (weights and optimizer state leave the GPU while other roles run) and "
    f"{A}.optimizer_cpu_offload (fp32 masters and Adam on the host, the step on the CPU); for sharding, "
    f"TP/PP and offload use {A}.strategy=megatron with {A}.megatron.* (param_offload, optimizer_offload, "
    "use_distributed_optimizer)"
)
_REF_FSDP = (
    f"dagrl's reference model follows the actor's backend: torch keeps it beside the actor, megatron "
    f"takes {REF}.megatron.* (param_offload, tensor/pipeline sizes)"
)
_CPU_OPTIMIZER = (
    "optimizer_cpu_offload",
    "optimizer_offload_fraction",
    "overlap_cpu_optimizer_d2h_h2d",
    "use_precision_aware_optimizer",
)
_ESTIMATORS = (
    "grpo|rloo|reinforce_plus_plus|reinforce_plus_plus_baseline|gae"
    " (presets of the first three; gae: algorithm=ppo)"
)
_PROFILER = "dagrl has no built-in profiler hooks; per-node seconds are the timing_s/<node> metrics"

TABLE: dict[str, Alias | OnlyValue | Unsupported] = {
    # ---- verl / siiRL: same concept, another name
    f"{M}.enable_gradient_checkpointing": Alias(f"{M}.gradient_checkpointing"),
    f"{A}.optim.clip_grad": Alias(f"{A}.grad_clip"),
    f"{R}.prompt_length": Alias("data.max_prompt_length"),
    f"{R}.response_length": Alias("data.max_response_length"),
    # verl's custom reward: the three keys make one reward term together (dagrl/config/custom_reward.py
    # translates them before this table; they are listed here for docs/compat.md)
    "custom_reward_function.path": Alias("external_plugins"),  # appended to the given entries
    "custom_reward_function.name": Alias("reward.functions", _reward_terms),  # verl's default: compute_score
    "custom_reward_function.reward_kwargs": Alias("reward.functions"),  # the term's kwargs
    **{  # verl/siiRL's megatron optimizer overrides: megatron-core's CPU optimizer (HybridDeviceOptimizer)
        f"{A}.optim.override_optimizer_config.{k}": Alias(f"{A}.megatron.{k}") for k in _CPU_OPTIMIZER
    },
    # ---- verl: one value is what dagrl does
    "data.truncation": OnlyValue(
        ("error",),
        "dagrl never truncates a prompt: it drops over-long ones (data.filter_overlong_prompts=true) or "
        "refuses them (false), which is verl's truncation=error",
    ),
    f"{M}.use_shm": OnlyValue((False,), "models are read from their path"),
    f"{A}.megatron.use_dist_checkpointing": OnlyValue(
        (False,), "megatron starts from the HF weights at actor_rollout_ref.model.path"
    ),
    f"{REF}.megatron.use_dist_checkpointing": OnlyValue(
        (False,), "megatron starts from the HF weights at actor_rollout_ref.model.path"
    ),
    "trainer.balance_batch": OnlyValue((False,), "rows are split over DP ranks in order"),
    "algorithm.use_pf_ppo": OnlyValue((False,), "dagrl has no PF-PPO reweighting"),
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
    f"{A}.optim.override_optimizer_config": Unsupported(
        f"dagrl takes megatron-core's CPU-offload settings ({', '.join(_CPU_OPTIMIZER)}) from here as "
        f"{A}.megatron.*; the others follow {A}.optim and {A}.megatron.param_dtype"
    ),
    f"{A}.megatron.use_mbridge": Unsupported("dagrl converts HF weights itself; remove the key"),
    f"{M}.use_remove_padding_in_ref": Unsupported(f"{M}.use_remove_padding covers every pass"),
    f"{M}.use_fused_kernels": Unsupported(
        "dagrl picks its log-prob kernel itself (Triton on CUDA; the environment variable "
        "DAGRL_LOGPROB_KERNEL=torch|triton forces one); remove the key"
    ),
    f"{M}.use_liger": Unsupported("dagrl does not patch models with Liger kernels; remove the key"),
    f"{M}.enable_activation_offload": Unsupported(
        f"use {M}.gradient_checkpointing (either backend) or {A}.megatron.recompute_granularity"
    ),
    f"{M}.lora": Unsupported(f"LoRA is {M}.lora_rank, lora_alpha, target_modules, lora_dropout"),
    f"{M}.exclude_modules": Unsupported(f"list the layers that get adapters in {M}.target_modules"),
    f"{M}.lora_adapter_path": Unsupported(
        "LoRA runs start from fresh adapters on the base at model.path; merge a trained adapter into it first"
    ),
    f"{M}.layered_summon": NoEffect("dagrl's weight sync streams bounded buckets already"),
    f"{M}.external_lib": Unsupported("list the module in external_plugins"),
    f"{M}.override_config": Unsupported("model settings come from the HF config.json at the model path"),
    f"{R}.mode": Unsupported(
        "dagrl's rollout runs one engine per worker on whole batches; to sample the next batch while "
        f"this one trains use placement=separate {R}.overlap_steps=1"
    ),
    f"{R}.multi_turn.interaction_config_path": Unsupported(
        f"a simulated user is an environment: register one and name it in {R}.multi_turn.environment"
    ),
    f"{R}.multi_turn.use_inference_chat_template": Unsupported(
        "dagrl never re-renders the history: observations are tokenized between the template's "
        "delimiters and the sampled ids are kept as sampled (docs/multi_turn.md)"
    ),
    f"{R}.multi_turn.tokenization_sanity_check_mode": Unsupported(
        "dagrl never re-tokenizes the history, so there is nothing to check (docs/multi_turn.md)"
    ),
    f"{R}.agent": Unsupported(
        f"dagrl's multi-turn rollout is {R}.multi_turn.* with environments and tools as plugins "
        "(docs/multi_turn.md)"
    ),
    "data.return_raw_chat": Unsupported(
        "dagrl applies the chat template once in the data layer; rollouts receive token ids"
    ),
    "data.tokenizer": Unsupported("the tokenizer is the model's own (actor_rollout_ref.model.path)"),
    "data.dataloader_num_workers": Unsupported("rows are tokenized once at start; remove the key"),
    "data.gen_batch_size": Unsupported("each dynamic-sampling round samples data.train_batch_size prompts"),
    "data.custom_cls": Unsupported("data rows are parquet in verl's layout (docs/data.md)"),
    # ---- verl: PPO's critic (critic.*)
    "critic.model.enable_gradient_checkpointing": Alias("critic.model.gradient_checkpointing"),
    "critic.model.use_remove_padding": Unsupported(
        "the critic runs padded micro-batches of rows (packing is the actor's: actor_rollout_ref.model.use_remove_padding)"
    ),
    "critic.model.fsdp_config": Unsupported(
        f"the torch critic is data-parallel (DDP) and offloads with the actor ({A}.offload); TP and"
        " offload switches of its own are critic.strategy=megatron with critic.megatron.*"
    ),
    "critic.megatron.seed": Unsupported("trainer.seed seeds every role"),
    "critic.megatron.use_dist_checkpointing": OnlyValue(
        (False,), "the megatron critic starts from the HF weights at critic.model.path"
    ),
    "critic.megatron.override_transformer_config": Unsupported(
        "recompute is critic.megatron.recompute_granularity / recompute_method / recompute_num_layers; "
        "other transformer settings come from the HF config"
    ),
    "critic.megatron.use_mbridge": Unsupported("dagrl converts HF weights itself; remove the key"),
    **{  # as the actor's: megatron-core's CPU optimizer settings live in the megatron section
        f"critic.optim.override_optimizer_config.{k}": Alias(f"critic.megatron.{k}") for k in _CPU_OPTIMIZER
    },
    "critic.ppo_micro_batch_size": Unsupported(
        "give the per-device size: critic.ppo_micro_batch_size_per_gpu"
    ),
    "critic.forward_micro_batch_size": Unsupported(
        "give the per-device size: critic.forward_micro_batch_size_per_gpu"
    ),
    "trainer.max_critic_ckpt_to_keep": Unsupported(
        "the critic is saved in every checkpoint beside the actor: trainer.max_actor_ckpt_to_keep keeps both"
    ),
    "reward_model": Unsupported(
        "dagrl's reward model is reward.model.* (enable, path, weight, micro_batch_size_per_gpu: a "
        "sequence-classification model on role rm); rule rewards are reward.functions"
    ),
    # ---- verl: reward model as a role (reward.model.*, dagrl/backends/reward_model.py)
    "reward_model.overlong_buffer": Alias("reward.overlong_buffer"),  # DAPO's recipe
    "reward_model.reward_kwargs.overlong_buffer_cfg": Alias("reward.overlong_buffer"),  # verl >= 0.5
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
    "trainer.default_hdfs_dir": Unsupported("checkpoints go to trainer.default_local_dir"),
    "trainer.resume_from_path": Unsupported("give the global_step_N directory as trainer.resume_mode"),
    "trainer.log_val_generations": Unsupported("validation logs its reward and length metrics"),
    "ray_kwargs": Unsupported("dagrl starts Ray itself; join a cluster with trainer.ray_address=auto"),
    "ray_init": Unsupported("dagrl starts Ray itself; join a cluster with trainer.ray_address=auto"),
    # ---- ms-swift (Ray GRPO / GKD yaml keys, given as overrides): same concept, another name
    "colocate_groups": Alias("placement.colocate_groups"),
    "device_groups": Alias("placement.device_groups"),
    "num_generations": Alias(f"{R}.n"),
    "max_turns": Alias(f"{R}.multi_turn.max_assistant_turns"),
    "max_completion_length": Alias("data.max_response_length"),
    "num_train_epochs": Alias("trainer.total_epochs"),
    "max_epochs": Alias("trainer.total_epochs"),  # ms-swift's megatron name before 4.0
    # train_iters, save_steps, eval_steps count optimizer steps: dagrl/config/swift_keys.py
    "save_total_limit": Alias("trainer.max_actor_ckpt_to_keep"),
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
    **{k: Alias(f"{A}.megatron.{k}") for k in _CPU_OPTIMIZER},  # Megatron-SWIFT's optimizer offload
    # ms-swift / PEFT LoRA names (tuner_type is resolved in swift_keys: it depends on lora_rank)
    **{f"{section}{k}": Alias(f"{M}.{k}") for section in ("", "train.") for k in LORA_KEYS},
    "model": Alias(f"{M}.path"),  # the student's model, as ms-swift's `model`
    "torch_dtype": Alias(f"{M}.dtype"),
    "max_length": Alias("data.max_prompt_length"),  # ms-swift Ray: the prompt is capped at max_length
    "padding_free": Alias(f"{M}.use_remove_padding"),
    "external_plugins": Alias("external_plugins", _as_list),  # one file as a string, or a list
    "output_dir": Alias("trainer.default_local_dir"),
    "train.output_dir": Alias("trainer.default_local_dir"),
    "nnodes": Alias("trainer.nnodes"),
    "tensor_model_parallel_size": Alias(f"{A}.megatron.tensor_model_parallel_size"),
    "pipeline_model_parallel_size": Alias(f"{A}.megatron.pipeline_model_parallel_size"),
    "context_parallel_size": Alias(f"{A}.megatron.context_parallel_size"),
    "expert_model_parallel_size": Alias(f"{A}.megatron.expert_model_parallel_size"),
    "sequence_parallel": Alias(f"{A}.megatron.sequence_parallel"),
    "train.sequence_parallel": Alias(f"{A}.megatron.sequence_parallel"),
    "recompute_granularity": Alias(f"{A}.megatron.recompute_granularity"),
    "recompute_method": Alias(f"{A}.megatron.recompute_method"),
    "recompute_num_layers": Alias(f"{A}.megatron.recompute_num_layers"),
    "lr_warmup_fraction": Alias(f"{A}.optim.lr_warmup_steps", _zero_warmup),
    "vllm_tensor_parallel_size": Alias(f"{R}.tensor_model_parallel_size"),
    "vllm_gpu_memory_utilization": Alias(f"{R}.gpu_memory_utilization"),
    "vllm_max_model_len": Alias(f"{R}.max_model_len"),
    "vllm_enforce_eager": Alias(f"{R}.enforce_eager"),
    "vllm_engine_kwargs": Alias(f"{R}.engine_kwargs.vllm", entries=True),
    "rollout.vllm_enforce_eager": Alias(f"{R}.enforce_eager"),
    "rollout.vllm_engine_kwargs": Alias(f"{R}.engine_kwargs.vllm", entries=True),
    "teacher.vllm_engine_kwargs": Alias("teacher.engine_kwargs", entries=True),
    "teacher.vllm_gpu_memory_utilization": Alias("teacher.engine_kwargs.gpu_memory_utilization"),
    "teacher.vllm_max_model_len": Alias("teacher.engine_kwargs.max_model_len"),
    # ---- ms-swift: one value is what dagrl does
    "finetune": OnlyValue((True,), "dagrl starts every run from the HF weights at the model path"),
    "logging_steps": OnlyValue((1,), "dagrl logs every step"),
    "split_dataset_ratio": OnlyValue((0, 0.0), "validation rows come from data.val_files"),
    "advantage_estimator": OnlyValue(("grpo",), f"verl's names: algorithm.adv_estimator={_ESTIMATORS}"),
    "importance_sampling_level": OnlyValue(("token",), "sequence-level ratios are algorithm=gspo"),
    "overlong_filter": OnlyValue((False,), "truncated responses are trained on like any other"),
    # ---- ms-swift: no effect on results here
    "dataset_num_proc": NoEffect("rows are tokenized once, in the driver"),
    "load_from_cache_file": NoEffect("rows are tokenized once per run; nothing is cached"),
    "attention_backend": NoEffect("the attention kernel follows the backend (megatron: layer_spec)"),
    "cross_entropy_loss_fusion": NoEffect("dagrl picks its log-prob kernel itself"),
    "gradient_accumulation_fusion": NoEffect("a megatron kernel choice; dagrl sets it"),
    "no_save_optim": NoEffect(
        "checkpoints always hold the optimizer state (trainer.save_freq=-1 saves none)"
    ),
    "no_save_rng": NoEffect("checkpoints always hold the data and sampling state"),
    # the rollout-vs-trainer mismatch metrics need the engine's log-probs; false leaves them to auto
    "log_rollout_offpolicy_metrics": Alias(f"{R}.calculate_log_probs", _log_probs_asked),
    "rollout_importance_sampling_mode": Alias("algorithm.rollout_correction.rollout_is", _swift_rollout_is),
    "rollout_importance_sampling_threshold": Alias("algorithm.rollout_correction.rollout_is_threshold"),
    "max_grad_norm": Alias(f"{A}.grad_clip"),
    "weight_decay": Alias(f"{A}.optim.weight_decay"),
    "loss_type": Alias(f"{A}.loss_agg_mode", _swift_loss_type),
    "scale_rewards": Alias("algorithm.norm_adv_by_std_in_grpo", _swift_scale_rewards),
    "dynamic_sample": Alias("algorithm.filter_groups.enable"),
    "max_resample_times": Alias("algorithm.filter_groups.max_num_gen_batches", _swift_max_resample_times),
    "kl_in_reward": OnlyValue(
        (False,),
        "the KL as a reward is algorithm.use_kl_in_reward=true with algorithm.kl_ctrl.kl_coef (not beta)",
    ),
    "vllm_mode": OnlyValue(
        ("colocate",),
        "the engine shares the trainer's cards by default; on cards of its own: placement=separate",
    ),
    "lr_scheduler_type": OnlyValue(
        ("constant_with_warmup",),
        f"dagrl's learning rate rises linearly over {A}.optim.lr_warmup_steps (10; 0 = none), then stays",
    ),
    "top_entropy_quantile": OnlyValue((1.0, 1), "every response token is in the loss"),
    "delta": OnlyValue((None,), f"the dual clip is {A}.clip_ratio_c (a bound on negative-advantage tokens)"),
    "move_model_batches": NoEffect("the weight sync moves the weights in buckets of its own"),
    # ---- ms-swift: missing here
    "dataset": Unsupported(
        "dagrl reads parquet rows in verl's layout: data.train_files=... data.val_files=... "
        "(examples/data_preprocess writes them; docs/data.md)"
    ),
    "system": Unsupported("put the system turn into the rows' prompt messages when preprocessing"),
    "min_lr": Unsupported("dagrl's learning rate is constant after warm-up: remove min_lr"),
    "generation_batch_size": Unsupported(
        "give global_batch_size and steps_per_generation (rollout prompts = their product / num_generations)"
    ),
    "rlhf_type": Unsupported(
        "choose the preset: algorithm=grpo or algorithm=gkd (a --config file takes rlhf_type)"
    ),
}

# verl's root configs given with --config-name: dagrl has one root config, the strategy picks megatron.
CONFIG_NAMES = {
    "ppo_trainer": [],
    "ppo_megatron_trainer": [f"{A}.strategy=megatron"],
}
