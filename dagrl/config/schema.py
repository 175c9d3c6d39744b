"""Typed config schemas, registered in Hydra's ConfigStore.

Key names follow verl/siiRL where the concept exists. Defaults live here and nowhere else.
An unknown key or a value of the wrong type fails at the command line, naming the key.
Dataclasses stay unfrozen: Hydra must be able to apply overrides to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from dagrl.algos.losses import KLEstimator, LossAggMode
from dagrl.config.enums import (  # noqa: F401  (re-exported: config users import them from here)
    BuiltinTask,
    Device,
    LayerSpec,
    LoggerName,
    ModelDtype,
    RecomputeGranularity,
    RecomputeMethod,
    ResumeMode,
    RolloutISLevel,
    RolloutRSLevel,
    SelfTeacher,
    TeacherPlacement,
    TruncateSide,
    TurnRewardMode,
    parse_resume_mode,
)
from dagrl.config.ranges import ranged
from dagrl.config.sample_schema import RewardModelConfig, SampleConfig


@dataclass
class DataConfig:
    train_files: Optional[Any] = None
    """Parquet file(s) of training rows (examples/data_preprocess); None = the built-in task."""
    val_files: Optional[Any] = None
    """Parquet file(s) of validation rows; None = the built-in task's test split (or none with train_files)."""
    prompt_key: str = "prompt"
    """Column holding each row's chat messages."""
    response_key: str = "response"
    """Column holding each row's reference response (text; ms-swift's query/response naming), read
    by distillation's off-policy steps and SFT term (algorithm.gkd.lmbda < 1, sft_alpha > 0).
    `column.key` reads a key of a dict column: `extra_info.answer` is verl's
    response_key=extra_info with response_dict_keys=[answer]."""
    train_batch_size: int = ranged(16, ge=1)
    """Prompts per step (each sampled rollout.n times)."""
    val_batch_size: Optional[int] = ranged(None, ge=1)
    """Validation prompts generated at once; None = all of them in one batch."""
    max_prompt_length: int = ranged(32, ge=1)
    """Longest prompt in tokens; longer ones are dropped (filter_overlong_prompts) or refused."""
    max_response_length: int = ranged(8, ge=1)
    """Most tokens sampled per response."""
    filter_overlong_prompts: bool = True
    """Drop prompts over max_prompt_length instead of failing on them."""
    shuffle: bool = True
    """Shuffle the training rows every epoch."""
    seed: int = ranged(1, ge=0)
    """Seed of the shuffle and of the built-in task's generator."""
    builtin_task: BuiltinTask = BuiltinTask.arith
    """The built-in task when data.train_files is unset: arith, or calculator (multi-turn, with
    its own tiny model when actor_rollout_ref.model.path is unset)."""
    builtin_train_rows: int = ranged(2048, ge=1)
    """Rows of the built-in task's training split."""
    builtin_val_rows: int = ranged(128, ge=1)
    """Rows of the built-in task's validation split."""


@dataclass
class ModelConfig:
    path: Optional[str] = None
    """HF model directory or hub id of the actor (and rollout/ref); None = the shipped tiny model."""
    dtype: ModelDtype = ModelDtype.float32
    """Weights dtype: float32, bfloat16 or float16 (fp32/bf16/fp16 also accepted)."""
    trust_remote_code: bool = False
    """Let transformers run the model repository's own code."""
    gradient_checkpointing: Optional[bool] = None
    """Recompute activations in the backward pass (torch backend): less memory, more time. None =
    auto: on when the memory plan's update phase would not fit the card without it (the dry run
    says which was chosen; dagrl/trainer/memory_plan.py)."""
    use_remove_padding: bool = False
    """Pack sequences without padding in the train and log-prob passes (docs/packing.md)."""


@dataclass
class OptimConfig:
    lr: Optional[float] = ranged(None, gt=0, hint="e.g. 1e-6 for 1B–8B models")
    """AdamW learning rate; None = the built-in tiny model's rate (any other model must set it)."""
    weight_decay: float = ranged(0.0, ge=0)
    """AdamW weight decay."""
    betas: list = ranged(default_factory=lambda: [0.9, 0.999], ge=0, lt=1, length=2)
    """AdamW (beta1, beta2)."""
    eps: float = ranged(1e-8, gt=0, hint="1e-8 is usual")
    """AdamW epsilon."""
    lr_warmup_steps: int = ranged(10, ge=0)
    """Linear warmup steps; Adam's first steps are otherwise full-size."""


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = ranged(1, ge=1, hint="1 = not split")
    """TP: each layer's weights split over this many devices."""
    pipeline_model_parallel_size: int = ranged(1, ge=1, hint="1 = not split")
    """PP: layers split into this many stages."""
    virtual_pipeline_model_parallel_size: Optional[int] = ranged(None, ge=1, hint="or null = no interleaving")
    """Interleaved pipeline chunks per stage (VPP); None = off."""
    context_parallel_size: int = ranged(1, ge=1, hint="1 = not split")
    """CP: sequences split over this many devices (needs layer_spec=te)."""
    expert_model_parallel_size: int = ranged(1, ge=1, hint="1 = not split")
    """EP: MoE experts split over this many devices."""
    expert_tensor_parallel_size: Optional[int] = ranged(
        None, ge=1, hint="or null = tensor_model_parallel_size"
    )
    """TP inside each expert; None = tensor_model_parallel_size."""
    sequence_parallel: bool = False
    """Split norms/dropout activations over the TP ranks (needs TP > 1)."""
    use_distributed_optimizer: bool = True
    """Shard the optimizer state over the data-parallel ranks."""
    param_dtype: ModelDtype = ModelDtype.bfloat16
    """Weights dtype on the device: bfloat16, float16 or float32."""
    param_offload: bool = False
    """Keep weights in host memory while another role holds the device."""
    grad_offload: bool = False
    """Keep gradient buffers in host memory while another role holds the device."""
    optimizer_offload: bool = False
    """Keep the optimizer state in host memory while another role holds the device."""
    optimizer_cpu_offload: bool = False
    """Run the optimizer on the CPU: fp32 master weights and Adam's moments in host memory
    (megatron-core's HybridDeviceOptimizer; verl's override_optimizer_config.optimizer_cpu_offload)."""
    optimizer_offload_fraction: float = ranged(1.0, ge=0, le=1)
    """With optimizer_cpu_offload: the share of the parameters whose optimizer state and step go to
    the CPU (the rest stay on the device)."""
    overlap_cpu_optimizer_d2h_h2d: bool = False
    """With optimizer_cpu_offload: overlap the gradient D2H / weight H2D copies with the CPU step
    (one CPU optimizer per parameter, side CUDA streams)."""
    use_precision_aware_optimizer: bool = False
    """Let the optimizer keep the fp32 master weights (on the CPU with optimizer_cpu_offload, so the
    device holds none: 12 bytes per parameter less); needs use_distributed_optimizer. Without CPU
    offload it needs TransformerEngine's FusedAdam."""
    recompute_granularity: Optional[RecomputeGranularity] = None
    """Activation recompute: full, selective, or None (off)."""
    recompute_method: Optional[RecomputeMethod] = None
    """With full recompute: uniform or block."""
    recompute_num_layers: Optional[int] = ranged(None, ge=1, hint="or null")
    """With full recompute: layers per recompute unit (uniform) or recomputed per stage (block)."""
    layer_spec: LayerSpec = LayerSpec.auto
    """Transformer-layer implementation: auto, te, sdpa or local."""


@dataclass
class ActorConfig:
    strategy: str = "torch"
    """Registered train backend: torch (HF model, AdamW, DDP), megatron (actor.megatron.*), or a plugin's."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    ppo_mini_batch_size: int = ranged(16, ge=1)
    """Prompts per optimizer step, as in verl (× rollout.n responses); must divide data.train_batch_size."""
    ppo_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Responses per forward/backward on each device; gradients accumulate over a mini-batch."""
    use_dynamic_bsz: bool = False
    """Cut micro-batches to a token budget (ppo_max_token_len_per_gpu) instead of a count of
    responses, as verl: rows are taken in order while their prompt + response tokens fit."""
    ppo_max_token_len_per_gpu: int = ranged(16384, ge=1)
    """use_dynamic_bsz: prompt + response tokens per micro-batch on each device (a longer single
    sequence forms a micro-batch of its own)."""
    ppo_epochs: int = ranged(1, ge=1)
    """Passes over each step's batch."""
    shuffle: bool = False
    """Shuffle the rows before cutting mini-batches (seeded by the step)."""
    grad_clip: float = ranged(
        1.0,
        gt=0,
        hint="a negative or zero bound would flip or zero the gradient; use a large value (e.g. 1e6) to clip nothing",
    )
    """Clip the global gradient norm to this value before each optimizer step."""
    clip_ratio: float = ranged(0.2, gt=0, lt=10, hint="0.2 is the usual value")
    """PPO clip range: token ratios are clipped to [1 - clip_ratio, 1 + clip_ratio] unless the two
    bounds below are set (GSPO clips its sequence ratio with the same keys)."""
    clip_ratio_low: Optional[float] = ranged(None, gt=0, lt=10, hint="or null = clip_ratio")
    """Lower clip bound: the ratio is clipped at 1 - clip_ratio_low. None = clip_ratio."""
    clip_ratio_high: Optional[float] = ranged(None, gt=0, lt=10, hint="or null = clip_ratio")
    """Upper clip bound: 1 + clip_ratio_high (DAPO's clip-higher sets it above the lower one).
    None = clip_ratio."""
    clip_ratio_c: float = ranged(3.0, gt=1, hint="dual-clip bound, e.g. 3.0")
    """Dual-clip bound (> 1): a token with negative advantage loses at most -A × clip_ratio_c
    (Ye et al. 2020). Used by GRPO and Dr. GRPO, not by GSPO."""
    loss_agg_mode: LossAggMode = LossAggMode.token_mean
    """How per-token losses become one number: token-mean (every token weighs the same),
    seq-mean-token-mean (each response weighs the same: original GRPO), seq-mean-token-sum, or
    seq-mean-token-sum-norm (Dr. GRPO: token sums over the constant data.max_response_length)."""
    use_kl_loss: bool = False
    """Add kl_loss_coef × KL(actor || reference) to the loss; runs the reference model (ref_logprob)."""
    kl_loss_coef: float = ranged(0.001, ge=0)
    """Weight of the KL loss."""
    kl_loss_type: KLEstimator = KLEstimator.k3
    """Estimator of the KL loss (Schulman 2020): k1, k2, k3 or abs; verl's names kl, mse and
    low_var_kl (= k3, the default) are accepted."""
    entropy_coeff: float = ranged(0.0, hint="negative values penalise entropy")
    """Weight of the entropy bonus subtracted from the loss; 0 = entropy is only reported."""
    offload: bool = True
    """torch strategy, colocated on a GPU: params and optimizer state go to CPU while other roles
    (rollout, ref) use the device; false keeps them resident (fastest when everything fits)."""
    optimizer_cpu_offload: bool = False
    """torch strategy: the fp32 master weights, their gradients and Adam's moments live in pinned
    host memory and the optimizer step runs on the CPU (the device keeps the compute weights and
    gradients: 4 bytes per parameter instead of 16 in bf16). megatron: megatron.optimizer_cpu_offload."""
    recompute_old_logprobs: Optional[bool] = None
    """false: an on-policy update (ppo_mini_batch_size = data.train_batch_size, ppo_epochs = 1)
    takes the old log-probs from its own forward, detached, and the old_logprob pass is skipped
    (the ratio is exactly 1, as TRL does with num_iterations=1). null (auto): false when the update
    is on-policy and nothing before it reads them (algorithm.use_kl_in_reward), else true."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """megatron-core layout and memory settings (strategy=megatron)."""


@dataclass
class SamplingConfig:
    temperature: float = ranged(1.0, ge=0, hint="0 = greedy")
    """Sampling temperature of validation (0 = greedy)."""
    top_p: float = ranged(1.0, gt=0, le=1, hint="1 = off")
    """Nucleus sampling mass of validation."""
    top_k: int = ranged(-1, ge=1, also=(-1,), hint="-1 = off")
    """Top-k of validation sampling; -1 = off."""
    n: int = ranged(1, ge=1)
    """Responses per validation prompt."""
    do_sample: bool = True
    """Sample (True) or decode greedily (False)."""


@dataclass
class VLLMEngineKwargs:
    vllm: dict[str, Any] = field(default_factory=dict)
    """Passed to vllm.LLM(...) as they are (e.g. kv_cache_dtype); keys dagrl sets from its own
    settings are refused by validate, naming the dagrl key to use instead."""


@dataclass
class MultiTurnConfig:
    """Multi-turn rollout (docs/multi_turn.md): the policy acts, tools or an environment answer,
    until the episode ends. verl's key names; ms-swift's `max_turns` is an alias of
    max_assistant_turns."""

    enable: bool = False
    """Run episodes of several turns instead of one response per prompt."""
    max_assistant_turns: int = ranged(4, ge=1)
    """Policy turns per episode at most (ms-swift: max_turns)."""
    max_user_turns: int = ranged(4, ge=0)
    """Observation turns (tool results, environment replies) per episode at most."""
    max_tokens_per_turn: Optional[int] = ranged(None, ge=1, hint="or null = what the episode has left")
    """Tokens one policy turn may sample at most; a turn cut there still goes to the environment
    (None: each turn may use what is left of data.max_response_length)."""
    environment: str = "tools"
    """Registered environment (dagrl/tools, or external_plugins): `tools` runs the tools of
    tool_config_path on the policy's tool calls."""
    tool_config_path: Optional[str] = None
    """YAML file listing the tools: `tools: [{name: <registered tool>, config: {...}}]`."""
    format: str = "hermes"
    """Tool-call parser: hermes (Qwen's `<tool_call>{json}</tool_call>`) or a registered one."""
    observation_role: str = "tool"
    """Chat-template role of observation turns (Qwen2.5/Qwen3 templates render `tool` turns)."""
    max_parallel_calls: int = ranged(1, ge=1)
    """Tool calls of one turn run at most (more are answered with an error observation)."""
    max_tool_response_length: int = ranged(256, ge=1)
    """Tokens of one observation's content at most (cut at tool_response_truncate_side)."""
    tool_response_truncate_side: TruncateSide = TruncateSide.middle
    """left (keep the end), right (keep the start) or middle (keep both ends)."""
    tool_timeout_s: float = ranged(10.0, gt=0)
    """One tool call's wall-clock limit; past it the call answers with an error observation."""
    episode_tool_timeout_s: float = ranged(60.0, gt=0)
    """An episode's total tool time limit; past it the episode ends."""
    tool_workers: int = ranged(16, ge=1)
    """Threads that run environment steps and tool calls of all episodes concurrently."""
    env_reward_weight: float = ranged(1.0, hint="negative values penalise the environment's rewards")
    """Weight of the environment's step rewards: in the score (trajectory), or of the per-turn
    advantage term (turn)."""
    turn_reward_mode: TurnRewardMode = TurnRewardMode.trajectory
    """trajectory: the environment's step rewards are summed into the episode's score (one
    advantage per episode); turn: each step reward is placed on the last policy token of its turn,
    normalised over the group's turns and summed from each token's turn on (reward-to-go, GRPO's
    process supervision, DeepSeekMath §4.1.3), added to the score's advantage × env_reward_weight."""


@dataclass
class RolloutConfig:
    name: str = "hf"
    """Registered rollout backend: hf (transformers, CPU default), vllm (GPUs; docs/vllm.md), or a plugin's."""
    dtype: Optional[ModelDtype] = None
    """The engine's weights dtype; None = the trainer's compute dtype (actor.megatron.param_dtype
    under strategy=megatron, actor_rollout_ref.model.dtype under torch)."""
    n: int = ranged(8, ge=1)
    """Responses sampled per prompt."""
    temperature: float = ranged(1.0, ge=0, hint="0 = greedy")
    """Sampling temperature of training rollouts (the trainer's log-probs use it too)."""
    top_p: float = ranged(1.0, gt=0, le=1, hint="1 = off")
    """Nucleus sampling mass; 1 = off."""
    top_k: int = ranged(-1, ge=1, also=(-1,), hint="-1 = off")
    """Top-k sampling; -1 = off."""
    tensor_model_parallel_size: int = ranged(1, ge=1)
    """vllm: tensor parallel size of each engine replica (hf: 1)."""
    gpu_memory_utilization: float = ranged(0.5, gt=0, le=1)
    """vllm: share of the GPU's memory the engine may take (weights + activations + KV cache)."""
    sleep_level: int = ranged(1, ge=1, le=2, hint="1 = weights kept in CPU memory, 2 = dropped")
    """vllm: 1 = weights to CPU while asleep, 2 = weights dropped (the next sync refills them)."""
    free_cache_engine: bool = True
    """vllm: sleep (free weights and KV cache) while colocated roles use the GPU; false keeps the
    engine resident, which is fastest when the trainer's state and the engine both fit."""
    max_num_batched_tokens: Optional[int] = ranged(None, ge=1, hint="or null for vLLM's default")
    """vllm: tokens per engine step; None = vLLM's default."""
    max_num_seqs: Optional[int] = ranged(None, ge=1, hint="or null for vLLM's default")
    """vllm: sequences per engine step; None = vLLM's default."""
    max_model_len: Optional[int] = ranged(None, ge=1, hint="or null")
    """vllm: context length; None = data.max_prompt_length + data.max_response_length."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs (slower decoding, faster start)."""
    enable_chunked_prefill: bool = True
    """vllm: split long prefills across engine steps."""
    enable_prefix_caching: bool = True
    """vllm: the n samples of a prompt share its prefill."""
    load_format: str = "auto"
    """vllm: auto reads the weights at start; dummy skips that (the first sync fills them)."""
    calculate_log_probs: bool = True
    """Return the sampled tokens' log-probs from the rollout engine (temperature applied): the
    rollout-vs-trainer mismatch metrics and algorithm.rollout_correction need them."""
    ignore_eos: bool = False
    """Keep sampling past EOS up to data.max_response_length (benchmarks)."""
    overlap_steps: int = ranged(0, ge=0, le=1, hint="0 = synchronous, 1 = rollout one step ahead")
    """Separate placement only: 0 = synchronous; 1 = the rollout of step t+1 runs while step t
    trains, on weights one step old (reported as rollout/staleness)."""
    engine_kwargs: VLLMEngineKwargs = field(default_factory=VLLMEngineKwargs)
    """Engine arguments passed through (engine_kwargs.vllm.*)."""
    log_prob_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Responses per forward of the old-log-prob pass."""
    log_prob_use_dynamic_bsz: bool = False
    """Cut the old-log-prob pass's micro-batches to log_prob_max_token_len_per_gpu tokens (verl)."""
    log_prob_max_token_len_per_gpu: int = ranged(16384, ge=1)
    """log_prob_use_dynamic_bsz: prompt + response tokens per forward of the old-log-prob pass."""
    micro_batch_size_per_gpu: int = ranged(256, ge=1)
    """hf: prompts × n sequences generated at once."""
    weight_sync_bucket_mb: int = ranged(256, ge=1)
    """Size of the buckets in which weights travel to the rollout engine."""
    weight_sync_direct: bool = True
    """Separate placement: from the second sync on, send weights in the engine's own layout,
    copied straight into its parameters (the map is learnt and checked at the first sync, when
    possible: rollout TP=1); false keeps HF-named buckets through the engine's loader."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of validation."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn episodes with tools or environments (off: one response per prompt)."""


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Sequences per forward pass of the reference model."""
    log_prob_use_dynamic_bsz: bool = False
    """Cut the reference pass's micro-batches to log_prob_max_token_len_per_gpu tokens (verl)."""
    log_prob_max_token_len_per_gpu: int = ranged(16384, ge=1)
    """log_prob_use_dynamic_bsz: prompt + response tokens per forward of the reference model."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """The reference model's megatron layout; unset fields follow the actor's."""


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's model (the reference starts from it too)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The policy's training."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling responses."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference model (KL loss / KL in reward)."""


@dataclass
class KLCtrlConfig:
    kl_coef: float = ranged(0.001, ge=0)
    """Weight of the KL penalty subtracted from the token rewards (algorithm.use_kl_in_reward)."""


@dataclass
class RolloutCorrectionConfig:
    """verl's algorithm.rollout_correction (dagrl/algos/rollout_correction.py)."""

    rollout_is: Optional[RolloutISLevel] = None
    """Importance weights π_old/π_rollout on the policy gradient: token, sequence, or null (off)."""
    rollout_is_threshold: float = ranged(2.0, gt=0, hint="2.0 is usual")
    """Truncation of the importance weights (TIS)."""
    rollout_rs: Optional[RolloutRSLevel] = None
    """Reject tokens (token) or whole responses (sequence, geometric mean) whose ratio leaves the
    bounds below; null = off."""
    rollout_rs_threshold: float = ranged(2.0, gt=0, hint="2.0 is usual")
    """Upper bound of the accepted ratio."""
    rollout_rs_threshold_lower: Optional[float] = ranged(
        None, gt=0, hint="or null = 1 / rollout_rs_threshold"
    )
    """Lower bound of the accepted ratio; None = 1 / rollout_rs_threshold."""


@dataclass
class GKDConfig:
    """Generalized knowledge distillation (Agarwal et al. 2024); ms-swift's key names, nested so that
    `temperature` does not collide with rollout.temperature."""

    beta: float = ranged(0.5, ge=0, le=1, hint="0 = forward KL, 1 = reverse KL")
    """Generalized JSD interpolation: 0 = KL(teacher||student), 1 = KL(student||teacher)."""
    temperature: float = ranged(1.0, gt=0)
    """Both models' logits are divided by it before the divergence (not the sampling temperature)."""
    gkd_logits_topk: Optional[int] = ranged(None, ge=1, hint="or null = the full vocabulary")
    """Distil on the teacher's top-k ids only; None = the full vocabulary (small vocabularies only)."""
    tail_bucket: bool = False
    """Top-k: keep the mass outside the teacher's top-k as one extra outcome instead of renormalising."""
    lmbda: float = ranged(1.0, ge=0, le=1)
    """Probability that a step trains on the student's own samples; the other steps (drawn from
    trainer.seed and the step number, so resumes repeat them) train on the dataset's responses
    (data.response_key) instead of sampling."""
    sft_alpha: float = ranged(0.0, ge=0)
    """Weight of an NLL (SFT) term on the dataset's responses, added on the off-policy steps."""


@dataclass
class DistillRewardConfig:
    """On-policy distillation as a reward (Thinking Machines' "On-Policy Distillation", slime): the
    per-token reverse KL of the sampled tokens, ``log π_student − log π_teacher``, enters the
    advantages as ``−coef × k1`` (held constant), next to any task-reward advantage."""

    coef: float = ranged(0.0, ge=0)
    """Weight of the per-token reverse-KL advantage; 0 = off. Needs teacher.model (the teacher's
    log-probs of the sampled tokens come from the teacher_logprob node)."""


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    """Registered objective of the actor update (dagrl/objectives, or a plugin's): choose a built-in
    with the preset `algorithm=grpo|dr_grpo|gspo|gkd|opsd`, which sets the keys it relies on too."""
    adv_estimator: str = "grpo"
    """Registered advantage estimator; grpo: each response against its prompt's group."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-relative advantages by the group's std (GRPO); false subtracts only the group
    mean (Dr. GRPO: the std up-weights prompts that are nearly always or never solved)."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.kl_coef × KL(actor || reference) from the token rewards before the
    advantages; runs the reference model (ref_logprob)."""
    kl_penalty: KLEstimator = KLEstimator.k1
    """Estimator of the in-reward KL: k1, k2, k3 or abs (verl's kl, mse, low_var_kl accepted)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """Fixed KL coefficient of the in-reward penalty."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights / rejection for the rollout-vs-trainer mismatch (verl's names)."""
    gkd: GKDConfig = field(default_factory=GKDConfig)
    """Distillation settings of algorithm.name=gkd and opsd (presets `algorithm=gkd|opsd`)."""
    distill_reward: DistillRewardConfig = field(default_factory=DistillRewardConfig)
    """Reverse KL to the teacher as a per-token advantage term, combinable with GRPO's."""


@dataclass
class RewardTermConfig:
    name: str = "gsm8k"
    """A registered reward function (built-in or from external_plugins)."""
    weight: float = ranged(1.0, hint="any finite weight; negative ones penalise")
    """Its weight in the sum."""


@dataclass
class RewardConfig:
    functions: list[RewardTermConfig] = field(default_factory=list)
    """Weighted reward functions; empty = pick the reward by each row's data_source (gsm8k, math, arith)."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A reward model served as role `rm` (verl's reward_model.*), added to the rule rewards by weight."""


@dataclass
class TeacherConfig:
    """The distillation teacher. The role exists only when `model` is set."""

    model: Optional[str] = None
    """HF model path or hub id of the teacher; None = no teacher role. `self`: a frozen copy of
    the student's initial weights; `self_current`: the policy being trained, in no-grad mode on
    the train workers (no teacher role): on-policy self-distillation."""
    dtype: Optional[ModelDtype] = None
    """Weights dtype (float32, bfloat16, float16); None = actor_rollout_ref.model.dtype."""
    placement: TeacherPlacement = TeacherPlacement.colocate
    """colocate: forward-only train backend on the train devices; standalone: vLLM on teacher.gpus."""
    gpus: int = ranged(0, ge=0)
    """Devices of a standalone teacher; 0 = an even share of the declared cluster with the other
    groups (standalone), or none of its own (a colocated teacher uses the train devices)."""
    tensor_model_parallel_size: int = ranged(1, ge=1)
    """vLLM tensor parallel size of a standalone teacher; must divide teacher.gpus."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the standalone teacher's vLLM engine."""
    offload: bool = False
    """Keep a colocated teacher's weights in host memory between its forwards (ms-swift offload_teacher_model)."""
    log_prob_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Sequences per forward pass of the teacher."""


@dataclass
class PlacementConfig:
    # the built-in roles are listed so `placement.gpus.rollout=2` overrides without a `+`
    gpus: dict[str, Optional[int]] = ranged(
        default_factory=lambda: {"train": None, "rollout": None, "ref": None, "teacher": None}, ge=0
    )
    """Devices per role (CPU slots when trainer.device=cpu); None = an even share of what is left."""
    colocate_groups: list[list[str]] = field(default_factory=lambda: [["train", "rollout", "ref"]])
    """Roles listed together share devices and take turns; every other role owns its devices."""
    device_groups: Optional[Any] = None
    """ms-swift's form instead of gpus + colocate_groups: {nproc_per_node, <group>: {device: GPU|CPU,
    ranks: [..] | n | 'list(range(a, b))', workers: [roles]}}, or the same as a JSON string.
    See dagrl/config/device_groups.py."""


@dataclass
class TrainerConfig:
    nnodes: int = ranged(1, ge=1)
    """Nodes of the cluster the plan is made for."""
    n_gpus_per_node: int = ranged(1, ge=1)
    """Devices per node of the cluster the plan is made for."""
    device: Device = Device.auto
    """auto, cpu or cuda. auto = cuda when a GPU is visible; on a machine without one a real run uses
    CPU slots, and a dry run plans GPUs when the declared cluster has more than one device
    (trainer.nnodes × trainer.n_gpus_per_node > 1): the plan is for the cluster named."""
    total_epochs: int = ranged(30, ge=1)
    """Passes over the training rows (as in verl; total_training_steps, when set, stops earlier)."""
    total_training_steps: Optional[int] = ranged(None, ge=1, hint="or null = total_epochs")
    """Steps to train; None = total_epochs decide (verl's default). The default job sets 40."""
    logger: list[LoggerName] = field(default_factory=lambda: [LoggerName.console, LoggerName.tensorboard])
    """Metric sinks: console, tensorboard, wandb (WANDB_MODE=offline works without a network);
    metrics.jsonl is always written. Same metric names in each."""
    project_name: str = "dagrl"
    """Project name (checkpoint and log directories)."""
    experiment_name: str = "default"
    """Experiment name (checkpoint and log directories)."""
    save_freq: int = ranged(-1, ge=1, also=(-1,), hint="-1 = never")
    """Save a checkpoint every this many steps and at the end; -1 = never."""
    save_hf: bool = False
    """Also write actor_hf/ (a transformers model directory) into every checkpoint."""
    test_freq: int = ranged(10, ge=1, also=(-1,), hint="-1 = never")
    """Validate every this many steps and at the end; -1 = never."""
    val_before_train: bool = True
    """Validate once before the first step."""
    resume_mode: str = "auto"
    """auto (latest checkpoint in default_local_dir), disable, or a global_step_N directory."""
    max_actor_ckpt_to_keep: Optional[int] = ranged(2, ge=1, hint="or null = keep all")
    """Checkpoints kept (oldest removed first); None = all."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Where checkpoints and metrics.jsonl go."""
    max_consecutive_skipped_steps: int = ranged(3, ge=0)
    """Stop the run when more steps than this in a row had an update skipped for a non-finite loss,
    gradient or reward (each skip is warned and counted in train/skipped_steps); 0 = stop at the first."""
    dry_run: bool = False
    """Print the placement plan and stop before Ray starts."""
    seed: int = ranged(1, ge=0)
    """Seed of model initialisation and of every step's sampling."""
    ray_address: Optional[str] = None
    """None = start a local Ray; auto = join the running cluster; or its address."""
    progress_bar: bool = True
    """Show a progress bar over the steps."""
    gpu_memory_gib: Optional[float] = ranged(None, gt=0, hint="or null = detected")
    """GPU memory per device the plan's estimate is checked against (a dry run warns, a run refuses
    before Ray starts); None = the visible GPU's, or 80 in a dry run on a machine without one."""


@dataclass
class DagrlConfig:
    dag: str = "grpo"
    """The step's DAG: conf/dags/<dag>.yaml."""
    external_plugins: list[str] = field(default_factory=list)
    """Modules or .py files imported first (driver and workers): node kinds, rewards, backends."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy model, its training, rollout and reference (verl's tree)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The objective and advantage settings."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Devices per role and which roles share them."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Cluster, steps, logging, checkpoints."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The distillation teacher (none by default)."""
    sample: SampleConfig = field(default_factory=SampleConfig)
    """The sampling pipeline (pipeline=sample): no training, parquet shards out."""
    roles: dict[str, Any] = field(default_factory=dict)
    """Plugin roles: `+roles.judge=my_judge` (the backend registered as ("judge", "my_judge")) or the
    role's own section (`PluginRoleConfig`), e.g. `+roles.judge={backend:my_judge,model:/ckpt/j}`."""


def register_configs() -> None:
    """Register the root schema so conf/config.yaml can extend it."""
    ConfigStore.instance().store(name="dagrl_schema", node=DagrlConfig)
