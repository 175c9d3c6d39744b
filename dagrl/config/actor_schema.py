"""The policy model and its training: `actor_rollout_ref.model.*`, `.actor.*` (optimizer, megatron)
and `.ref.*`. Part of the typed schema; import the types from dagrl.config.schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from dagrl.algos.losses import KLEstimator, LossAggMode
from dagrl.config.enums import LayerSpec, ModelDtype, RecomputeGranularity, RecomputeMethod
from dagrl.config.ranges import ranged


@dataclass
class ModelConfig:
    path: Optional[str] = None
    """HF model directory or hub id of the actor (and rollout/ref); None = the shipped tiny model."""
    dtype: ModelDtype = ModelDtype.float32
    """Weights dtype: float32, bfloat16 or float16 (fp32/bf16/fp16 also accepted)."""
    trust_remote_code: bool = False
    """Let transformers run the model repository's own code."""
    gradient_checkpointing: Optional[bool] = None
    """Recompute activations in the backward pass: less memory, more time. torch: HF's gradient
    checkpointing; megatron: full recompute of every layer unless actor.megatron.recompute_* are set.
    None = auto: on when the memory plan's update phase would not fit the card without it (the dry
    run says which was chosen; dagrl/trainer/capacity.py)."""
    use_remove_padding: bool = False
    """Pack sequences without padding in the train and log-prob passes (docs/packing.md)."""
    lora_rank: int = ranged(0, ge=0, hint="0 = train all weights; 8-64 is usual for LoRA")
    """LoRA rank (verl's key; ms-swift's and PEFT's `lora_rank`/`r`): > 0 trains low-rank adapters
    on `target_modules` and freezes the base in its dtype (torch: PEFT; megatron: its fused
    layers; docs/lora.md).
    0 = full-parameter training."""
    lora_alpha: float = ranged(16.0, gt=0)
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_rank."""
    target_modules: Any = "all-linear"
    """Linear layers that get adapters: `all-linear` (every linear layer of the decoder, not the
    output layer) or a list of module names (e.g. [q_proj, v_proj]); names are checked against the
    model's linear layers before the run starts."""
    lora_dropout: float = ranged(0.0, ge=0, lt=1)
    """Dropout on the adapter's input during the update (PEFT's lora_dropout)."""


@dataclass
class OptimConfig:
    lr: Optional[float] = ranged(None, gt=0, hint="e.g. 1e-6 for 1B–8B models")
    """AdamW learning rate. None: the actor's is the built-in tiny model's rate (any other model must
    set it); the critic's (critic.optim.lr) is the actor's."""
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
    """CP: sequences split over this many devices; > 1 is refused on every machine, with or without
    TransformerEngine (the backend's log-prob, loss and packing paths need whole sequences per rank)."""
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
    grad_offload: Optional[bool] = None
    """Free the fp32 gradient buffers while another role holds the device (they are zeroed at the
    next update's start, so nothing is copied). null (auto) = true: a colocated engine gets that
    memory; false keeps them allocated (no re-allocation, less room for the engine)."""
    optimizer_offload: bool = False
    """Keep the optimizer state in host memory while another role holds the device."""
    optimizer_cpu_offload: Optional[bool] = None
    """Run the optimizer on the CPU: fp32 master weights and Adam's moments in host memory
    (megatron-core's HybridDeviceOptimizer; verl's override_optimizer_config.optimizer_cpu_offload);
    needs a GPU and use_distributed_optimizer. null (auto): on only when the memory plan's update
    does not fit the card with the optimizer on the device (off where there is no plan: CPU,
    unknown card; and without the distributed optimizer)."""
    optimizer_offload_fraction: Optional[float] = ranged(None, ge=0, le=1, hint="or null = auto")
    """With optimizer_cpu_offload: the share of the parameters whose optimizer state and step go to
    the CPU (the rest stay on the device). null (auto): 1.0, unless the host cannot hold that much
    (17.6-18.3 bytes per offloaded parameter at the Qwen3 shapes: backends/megatron/optimizer_host.py);
    then the smallest share that keeps every phase within 90 % of the card and the host within
    90 % of its memory (the plan's note says which)."""
    overlap_cpu_optimizer_d2h_h2d: bool = False
    """With optimizer_cpu_offload: overlap the gradient D2H / weight H2D copies with the CPU step
    (one CPU optimizer per parameter, side CUDA streams)."""
    use_precision_aware_optimizer: Optional[bool] = None
    """Let the optimizer keep the fp32 master weights (on the CPU with optimizer_cpu_offload, so the
    device holds none: 4 bytes per parameter less); needs use_distributed_optimizer. Without CPU
    offload it needs TransformerEngine's FusedAdam. null (auto): on exactly when the CPU optimizer
    and the distributed optimizer are (else the distributed optimizer's fp32 main params stay on
    the device while a colocated engine runs)."""
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
    offload: Optional[bool] = None
    """torch strategy, colocated on a GPU: params and optimizer state go to CPU while other roles
    (rollout, ref) use the device; false keeps them resident (fastest when everything fits).
    null (auto): resident when the memory plan puts every phase within 90 % of the card with the
    trainer resident, else offloaded (offloaded where there is no plan: CPU, unknown card)."""
    optimizer_cpu_offload: Optional[bool] = None
    """torch strategy: the fp32 master weights, their gradients and Adam's moments live in pinned
    host memory and the optimizer step runs on the CPU (the device keeps the compute weights and
    gradients: 4 bytes per parameter instead of 16 in bf16). megatron: megatron.optimizer_cpu_offload.
    null (auto): on only when the memory plan's update does not fit the card with the optimizer on
    the device, after gradient checkpointing (off where there is no plan: CPU, unknown card)."""
    recompute_old_logprobs: Optional[bool] = None
    """false: an on-policy update (ppo_mini_batch_size = data.train_batch_size, ppo_epochs = 1)
    takes the old log-probs from its own forward, detached, and the old_logprob pass is skipped
    (the ratio is exactly 1, as TRL does with num_iterations=1). null (auto): false when the update
    is on-policy and nothing before it reads them (algorithm.use_kl_in_reward, distill_reward),
    else true."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """megatron-core layout and memory settings (strategy=megatron)."""


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
