"""The vllm backends' own rules (rollout engine and standalone teacher), registered with them
(dagrl/backends/builtin.py) and run before Ray starts when a role uses them. Importing this
module does not import vLLM."""

from __future__ import annotations

import importlib.util

from dagrl.backends.vllm.engine_args import (
    RESERVED_ENGINE_KWARGS,
    TEACHER_RESERVED_ENGINE_KWARGS,
    VLLM_DEFAULT_MAX_LOGPROBS,
    teacher_max_model_len,
)
from dagrl.config.schema import DagrlConfig, LoraSync, TeacherPlacement
from dagrl.errors import ConfigError

R = "actor_rollout_ref.rollout"
T = "teacher"
TOPK = "algorithm.gkd.gkd_logits_topk"


# the rollout keys only this engine reads (free_cache_engine is not one: an engine that never
# frees its cache, as hf's, already does what false asks); set with another engine, refused
VLLM_ROLLOUT_KEYS = (
    "gpu_memory_utilization",
    "sleep_level",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "enforce_eager",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "load_format",
    "engine_kwargs.vllm",
)


def check_vllm_rollout(cfg: DagrlConfig) -> None:
    """The vllm rollout's rules that need only the config."""
    r, d = cfg.actor_rollout_ref.rollout, cfg.data
    needed = d.max_prompt_length + d.max_response_length
    if r.max_model_len is not None and r.max_model_len < needed:
        raise ConfigError(
            f"{R}.max_model_len",
            r.max_model_len,
            f"must hold data.max_prompt_length + data.max_response_length = {needed}; raise it or leave it"
            " unset (then it is exactly that)",
        )
    _check_positions(cfg, r.max_model_len or needed)
    for key in r.engine_kwargs.vllm:
        if key in RESERVED_ENGINE_KWARGS:
            raise ConfigError(
                f"{R}.engine_kwargs.vllm.{key}",
                r.engine_kwargs.vllm[key],
                f"dagrl sets this engine argument itself; use {RESERVED_ENGINE_KWARGS[key]}",
            )
    _check_lora(cfg)
    if r.multi_turn.enable and r.tensor_model_parallel_size > 1:
        raise ConfigError(
            f"{R}.tensor_model_parallel_size",
            r.tensor_model_parallel_size,
            "multi-turn episodes on vLLM run one engine per GPU for now: each TP rank would have to see "
            "the same tool results in the same order; use 1 (more replicas) with multi_turn.enable=true",
        )
    if r.load_format == "dummy" and cfg.trainer.val_before_train:
        raise ConfigError(
            f"{R}.load_format",
            "dummy",
            "the engine starts with random weights and validation before training would score them;"
            " set trainer.val_before_train=false or load_format=auto",
        )


def check_rollout_device(cfg: DagrlConfig, device: str) -> None:
    """vLLM runs on GPUs only, and must be installed where the run starts (not for a dry run)."""
    r = cfg.actor_rollout_ref.rollout
    if r.name != "vllm" or cfg.trainer.dry_run:
        return
    if device != "cuda":
        raise ConfigError(
            f"{R}.name",
            "vllm",
            "vLLM needs GPUs; set trainer.device=cuda on a GPU machine, or use rollout.name=hf",
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{R}.name", "vllm", "vllm is not installed here; pip install -e '.[vllm]'")


def check_vllm_teacher(cfg: DagrlConfig) -> None:
    """A standalone teacher's engine rules that need only the config."""
    if cfg.teacher.placement == TeacherPlacement.standalone:
        check_standalone_engine(cfg)


def check_standalone_engine(cfg: DagrlConfig) -> None:
    """Engine kwargs dagrl sets itself are refused; the context holds prompt + response."""
    t = cfg.teacher
    for key, value in t.engine_kwargs.items():
        if key in TEACHER_RESERVED_ENGINE_KWARGS:
            raise ConfigError(
                f"{T}.engine_kwargs.{key}",
                value,
                f"dagrl sets this itself; use {TEACHER_RESERVED_ENGINE_KWARGS[key]}",
            )
    needed = teacher_max_model_len(cfg.data.max_prompt_length, cfg.data.max_response_length)
    context = t.engine_kwargs.get("max_model_len", needed)
    if context < needed:
        raise ConfigError(
            f"{T}.engine_kwargs.max_model_len",
            context,
            f"must hold data.max_prompt_length + data.max_response_length + 1 = {needed} (one token is"
            " sampled after prompt + response); raise it or leave it unset",
        )


def refuse_standalone_full_vocab() -> None:
    """A node asks a standalone teacher for the full vocabulary (its final hidden states)."""
    raise ConfigError(
        TOPK,
        None,
        "a standalone (vLLM) teacher returns top-k log-probs only, never the full vocabulary: set"
        f" {TOPK}=K (e.g. 64) and {T}.engine_kwargs.max_logprobs >= K",
    )


def check_standalone_topk(cfg: DagrlConfig) -> None:
    """A node asks a standalone teacher for its top-k: vLLM returns at most max_logprobs of them."""
    t, g = cfg.teacher, cfg.algorithm.gkd
    if g.gkd_logits_topk is None:
        refuse_standalone_full_vocab()
    max_logprobs = t.engine_kwargs.get("max_logprobs", VLLM_DEFAULT_MAX_LOGPROBS)
    if max_logprobs != -1 and max_logprobs < g.gkd_logits_topk:
        raise ConfigError(
            f"{T}.engine_kwargs.max_logprobs",
            max_logprobs,
            f"vLLM returns at most max_logprobs prompt log-probs per position (default"
            f" {VLLM_DEFAULT_MAX_LOGPROBS}) and {TOPK}={g.gkd_logits_topk}: set"
            f" +{T}.engine_kwargs.max_logprobs={g.gkd_logits_topk} or lower {TOPK}",
        )


def check_teacher_device(cfg: DagrlConfig, device: str) -> None:
    """A standalone teacher is vLLM: GPUs only, installed where the run starts (not for a dry run)."""
    t = cfg.teacher
    if t.model is None or t.placement != TeacherPlacement.standalone or cfg.trainer.dry_run:
        return
    if device != "cuda":
        raise ConfigError(
            f"{T}.placement",
            "standalone",
            "a standalone teacher runs vLLM, which needs GPUs: set trainer.device=cuda on a GPU machine,"
            f" or {T}.placement=colocate",
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{T}.placement", "standalone", "vllm is not installed here; pip install -e '.[vllm]'"
        )


def _check_positions(cfg: DagrlConfig, context: int) -> None:
    """vLLM refuses a context longer than the model's max_position_embeddings (a pydantic
    traceback after Ray started); name the lengths instead, unless the user allows it as vLLM does."""
    import os

    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return
    path = cfg.actor_rollout_ref.model.path
    if path is None:
        from dagrl.data.builtin import tiny_model_path

        path = tiny_model_path()
    config = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(config):
        return  # a hub id (or a path the model rules name): vLLM checks it when it starts
    import json

    with open(config) as f:
        positions = json.load(f).get("max_position_embeddings")
    if positions is not None and context > positions:
        pinned = cfg.actor_rollout_ref.rollout.max_model_len
        key, value = (
            (f"{R}.max_model_len", pinned)
            if pinned
            else ("data.max_response_length", cfg.data.max_response_length)
        )
        raise ConfigError(
            key,
            value,
            f"a context of {context} tokens (prompt + response, or rollout.max_model_len) exceed the model's max_position_embeddings ({positions})"
            f" that vLLM enforces: lower data.max_prompt_length / data.max_response_length, or export"
            " VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model's positions extrapolate (RoPE)",
        )


def _check_lora(cfg: DagrlConfig) -> None:
    """An adapter sync (lora_sync adapter, or auto to a 16-bit vLLM engine on devices of its own) needs an engine dtype
    and a rank vLLM's LoRA kernels take, and the base kept across sleeps: the sync never sends it
    again."""
    from dagrl.backends.vllm.engine_args import LORA_SERVING_DTYPES, VLLM_LORA_RANKS
    from dagrl.config.roles import policy_lora, rollout_dtype

    lora, r = policy_lora(cfg), cfg.actor_rollout_ref.rollout
    if lora is None or lora.sync != LoraSync.adapter:
        return
    if rollout_dtype(cfg) not in LORA_SERVING_DTYPES:
        raise ConfigError(
            f"{R}.lora_sync",
            "adapter",
            f"vLLM's LoRA kernels take bf16/fp16 and the engine runs in {rollout_dtype(cfg)}: set"
            f" {R}.dtype=bfloat16 (or actor_rollout_ref.model.dtype), or {R}.lora_sync=merged",
        )
    if lora.rank > VLLM_LORA_RANKS[-1]:
        raise ConfigError(
            "actor_rollout_ref.model.lora_rank",
            lora.rank,
            f"vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}: lower it, or {R}.lora_sync=merged",
        )
    if r.free_cache_engine is not False and r.sleep_level == 2:  # auto (None) may choose to sleep
        raise ConfigError(
            f"{R}.sleep_level",
            2,
            "level 2 drops the engine's base weights and an adapter sync never sends them again: use 1,"
            f" or {R}.lora_sync=merged (the whole merged model every sync)",
        )
