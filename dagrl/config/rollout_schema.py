"""The rollout engine's section: `actor_rollout_ref.rollout.*` (sampling, engine knobs, multi-turn).
Part of the typed schema; import the types from dagrl.config.schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from dagrl.config.enums import LoraSync, ModelDtype, TruncateSide, TurnRewardMode
from dagrl.config.ranges import ranged


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
    process supervision, DeepSeekMath §4.1.3), added to the score's advantage × env_reward_weight;
    with algorithm.adv_estimator=reinforce_plus_plus the placed rewards × env_reward_weight join
    the token rewards instead, so each turn gets the discounted (algorithm.gamma) return of its own
    and the later turns' rewards."""


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
    do_sample: bool = True
    """verl's switch: true samples at temperature / top_p / top_k; false decodes greedily (as
    temperature=0, whatever temperature says), which a group baseline (grpo, rloo) refuses."""
    tensor_model_parallel_size: int = ranged(1, ge=1)
    """vllm: tensor parallel size of each engine replica (hf: 1)."""
    gpu_memory_utilization: Optional[float] = ranged(None, gt=0, le=1, hint="or null = auto")
    """vllm: share of the GPU's memory the engine takes (weights + activations + KV cache); None
    (auto): the memory plan sizes it for the step's work where the engine stays awake beside a
    colocated trainer (free_cache_engine auto -> false), else 0.5 (docs/memory.md)."""
    sleep_level: int = ranged(1, ge=1, le=2, hint="1 = weights kept in CPU memory, 2 = dropped")
    """vllm: 1 = weights to CPU while asleep, 2 = weights dropped (the next sync refills them)."""
    free_cache_engine: Optional[bool] = None
    """vllm: sleep (free weights and KV cache) while colocated roles use the GPU; false keeps the
    engine resident, which is fastest when the trainer's state and the engine both fit. None
    (auto): false where the memory plan fits the awake engine and the trainer on the card with a
    tenth of it to spare, true otherwise (docs/memory.md)."""
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
    calculate_log_probs: Optional[bool] = None
    """Return the sampled tokens' log-probs from the rollout engine (temperature applied), for
    algorithm.rollout_correction, the distill reward without the old-log-prob pass and the
    rollout-vs-trainer mismatch metrics (rollout_corr/*). None (auto): on only where the step
    reads them; vLLM's per-token log-probs took 45 % of a 32x8x256 rollout on an H200 (docs/perf.md)."""
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
    """Size of the buckets in which weights travel to the rollout engine (separate placement: a
    direct sync holds two of them on each side)."""
    weight_sync_direct: bool = True
    """Separate placement: from the second sync on, send weights in the engine's own layout,
    copied straight into its parameters (the map is learnt and checked at the first sync, when
    possible: rollout TP=1); false keeps HF-named buckets through the engine's loader."""
    lora_sync: LoraSync = LoraSync.auto
    """With actor_rollout_ref.model.lora_rank > 0: what the weight sync sends. adapter: the
    adapters only, served by the engine's LoRA support (vllm); merged: the base with the adapters
    folded in, under the base's names (any engine). auto: merged where the engine shares the
    trainer's devices (an on-device copy; decoding without LoRA kernels), adapter where the weights
    cross devices to a bf16/fp16 vllm engine (its LoRA kernels take 16-bit inputs), merged to any
    other engine (hf, an fp32 engine); the plan prints the choice and why (docs/lora.md)."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of validation."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn episodes with tools or environments (off: one response per prompt)."""
