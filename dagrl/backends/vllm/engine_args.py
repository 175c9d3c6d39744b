"""From a role's spec to vLLM's engine and sampling arguments. Pure: no vLLM import, so the name
mapping and its rules are tested on machines without a GPU.

The rollout engine reads its spec's model, parallel layout, seed, sequence limits and `rollout`
section (actor_rollout_ref.rollout.*, decoded once by dagrl/config/roles.py); the standalone
teacher its spec's model, layout and `engine_kwargs` (teacher.engine_kwargs)."""

from __future__ import annotations

from typing import Any

from dagrl.config.enums import LoraSync

R = "actor_rollout_ref.rollout"

# vLLM engine arguments that dagrl sets from its own keys: passing them again through
# engine_kwargs.vllm would silently fight the dagrl setting, so validate refuses them.
RESERVED_ENGINE_KWARGS: dict[str, str] = {
    "model": "actor_rollout_ref.model.path",
    "dtype": f"{R}.dtype",
    "trust_remote_code": "actor_rollout_ref.model.trust_remote_code",
    "tensor_parallel_size": f"{R}.tensor_model_parallel_size",
    "gpu_memory_utilization": f"{R}.gpu_memory_utilization",
    "max_model_len": f"{R}.max_model_len",
    "max_num_batched_tokens": f"{R}.max_num_batched_tokens",
    "max_num_seqs": f"{R}.max_num_seqs",
    "enforce_eager": f"{R}.enforce_eager",
    "enable_chunked_prefill": f"{R}.enable_chunked_prefill",
    "enable_prefix_caching": f"{R}.enable_prefix_caching",
    "load_format": f"{R}.load_format",
    "enable_sleep_mode": f"{R}.free_cache_engine",
    "seed": "trainer.seed",
    "distributed_executor_backend": "(set by dagrl: one engine shard per worker process)",
    "logprobs_mode": "(set by dagrl: processed_logprobs, so temperature is reflected)",
    "skip_tokenizer_init": "(set by dagrl: rollouts exchange token ids, never text)",
    "generation_config": "(set by dagrl: sampling comes from actor_rollout_ref.rollout.*)",
    "disable_custom_all_reduce": "(set by dagrl: each worker sees one GPU, so TP all-reduces go through NCCL)",
    "enable_lora": "actor_rollout_ref.model.lora_rank with rollout.lora_sync=adapter",
    "max_lora_rank": "actor_rollout_ref.model.lora_rank",
    "max_loras": "(set by dagrl: one adapter, the policy's)",
}

# vLLM's accepted max_lora_rank values (vllm/config/lora.py: MaxLoRARanks); its LoRA kernels are
# sized by this bound, so the smallest one at or above the rank is taken
# engine dtypes vLLM's LoRA kernels take (vllm/lora/ops/triton_ops: fp16 / bf16 inputs only)
LORA_SERVING_DTYPES = ("bfloat16", "bf16", "float16", "fp16")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

_VLLM_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def max_model_len(spec) -> int:
    """The engine's context: rollout.max_model_len, or prompt + response length."""
    return spec.rollout.max_model_len or spec.lengths.total


def llm_kwargs(spec, model_path: str) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for this config.

    One engine shard lives in each rollout worker process (`external_launcher`): vLLM reuses the
    pool's process group, consecutive ranks form its TP groups, and every TP group is an
    independent data-parallel replica that receives its own share of the prompts.
    """
    r = spec.rollout
    kwargs: dict[str, Any] = dict(
        model=model_path,
        dtype=_VLLM_DTYPES[spec.model.dtype],
        trust_remote_code=spec.model.trust_remote_code,
        tensor_parallel_size=spec.parallel.tp,
        # None only where no memory plan resolved auto (a backend built from a bare spec): today's default
        gpu_memory_utilization=r.gpu_memory_utilization or SLEEPING_SHARE,
        max_model_len=max_model_len(spec),
        enforce_eager=r.enforce_eager,
        enable_chunked_prefill=r.enable_chunked_prefill,
        enable_prefix_caching=r.enable_prefix_caching,
        load_format=r.load_format,
        enable_sleep_mode=r.free_cache_engine is not False,
        seed=spec.seed,
        distributed_executor_backend="external_launcher",
        logprobs_mode="processed_logprobs",
        skip_tokenizer_init=True,
        generation_config="vllm",  # the model's own sampling defaults must not override dagrl's
        # Ray shows each worker only its own GPU, and vLLM's custom all-reduce maps peers through
        # CUDA_VISIBLE_DEVICES (IndexError at start with TP > 1): NCCL does the TP all-reduces
        disable_custom_all_reduce=True,
    )
    if r.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = r.max_num_batched_tokens
    if r.max_num_seqs is not None:
        kwargs["max_num_seqs"] = r.max_num_seqs
    if serves_adapter(spec):  # the policy's adapter, sent each sync
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(spec.lora.rank))
    kwargs.update(r.engine_kwargs.vllm)
    return kwargs


def serves_adapter(spec) -> bool:
    """Whether the engine serves the policy's LoRA adapter beside its base weights (enable_lora)."""
    return spec.lora is not None and spec.lora.sync == LoraSync.adapter


def vllm_lora_rank(rank: int) -> int:
    """The engine's max_lora_rank for an adapter of `rank` (validate refuses ranks above 512)."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


def adapter_peft_config(lora) -> dict[str, Any]:
    """The PEFT config vLLM's PEFTHelper reads for the policy's adapter (LoraSettings)."""
    targets = lora.target_modules
    return {
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "target_modules": targets if isinstance(targets, str) else list(targets),
        "bias": "none",
    }


def sampling_kwargs(spec, eos_ids: list[int], validate: bool) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one response per request.

    Greedy (val_kwargs.do_sample=false, or temperature 0) is temperature 0 in vLLM. EOS ids are
    given explicitly because the engine runs without a tokenizer; not with ignore_eos, which vLLM
    applies to its own EOS only (a listed stop id ends a response whatever ignore_eos says).
    """
    r = spec.rollout
    s = r.val_kwargs if validate else r
    greedy = (validate and not r.val_kwargs.do_sample) or s.temperature <= 0
    kwargs: dict[str, Any] = dict(
        n=1,
        temperature=0.0 if greedy else s.temperature,
        top_p=1.0 if greedy else s.top_p,
        top_k=0 if greedy or s.top_k <= 0 else s.top_k,
        max_tokens=spec.lengths.response,
        stop_token_ids=[] if r.ignore_eos else list(eos_ids),
        ignore_eos=r.ignore_eos,
        detokenize=False,
    )
    if r.calculate_log_probs:
        kwargs.update(logprobs=0, flat_logprobs=True)  # the sampled token's log-prob only
    return kwargs


T = "teacher"
# A standalone teacher's engine arguments that dagrl sets from teacher.* (or must control):
# teacher.engine_kwargs may pass any other vllm.LLM argument (max_logprobs, gpu_memory_utilization,
# max_model_len, enforce_eager, kv_cache_dtype, ...).
TEACHER_RESERVED_ENGINE_KWARGS: dict[str, str] = {
    "model": f"{T}.model",
    "dtype": f"{T}.dtype",
    "trust_remote_code": "actor_rollout_ref.model.trust_remote_code",
    "tensor_parallel_size": f"{T}.tensor_model_parallel_size",
    "seed": "trainer.seed",
    "distributed_executor_backend": "(set by dagrl: one engine shard per worker process)",
    "skip_tokenizer_init": "(set by dagrl: the teacher scores token ids, never text)",
    "logprobs_mode": "(set by dagrl: prompt log-probs are log-probabilities; "
    "algorithm.gkd.temperature sets the temperature)",
    "enable_sleep_mode": "(set by dagrl: a standalone teacher owns its GPUs and never sleeps)",
    "disable_custom_all_reduce": "(set by dagrl: each worker sees one GPU, so TP all-reduces go through NCCL)",
}
VLLM_DEFAULT_MAX_LOGPROBS = 20  # vllm.config.ModelConfig.max_logprobs: caps prompt_logprobs too
TEACHER_GPU_MEMORY_UTILIZATION = 0.85  # the teacher's GPUs hold nothing else
SLEEPING_SHARE = 0.5  # rollout.gpu_memory_utilization of an engine that sleeps while the trainer works


def teacher_max_model_len(prompt_length: int, response_length: int) -> int:
    """The teacher's context: prompt + response + the one token vLLM samples after them."""
    return prompt_length + response_length + 1


def teacher_llm_kwargs(spec, model_path: str) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for a standalone teacher replica shard.

    Same process layout as the rollout (`external_launcher`, consecutive ranks form a TP group,
    each TP group a data-parallel replica). The teacher only scores: no sleep mode, no prefix
    cache (prompt log-probs recompute every position anyway); teacher.engine_kwargs go last.
    """
    kwargs: dict[str, Any] = dict(
        model=model_path,
        dtype=_VLLM_DTYPES[spec.model.dtype],
        trust_remote_code=spec.model.trust_remote_code,
        tensor_parallel_size=spec.parallel.tp,
        gpu_memory_utilization=TEACHER_GPU_MEMORY_UTILIZATION,
        max_model_len=teacher_max_model_len(spec.lengths.prompt, spec.lengths.response),
        enable_prefix_caching=False,
        enable_sleep_mode=False,
        seed=spec.seed,
        distributed_executor_backend="external_launcher",
        logprobs_mode="raw_logprobs",
        skip_tokenizer_init=True,
        generation_config="vllm",
        disable_custom_all_reduce=True,
    )
    kwargs.update(spec.engine_kwargs)
    return kwargs


def teacher_sampling_kwargs(k: int) -> dict[str, Any]:
    """`vllm.SamplingParams` of one scoring request: the top-k at every prompt position. vLLM
    samples one token after the prompt (max_tokens >= 1); it is greedy and thrown away."""
    return dict(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=k, flat_logprobs=True, detokenize=False)
