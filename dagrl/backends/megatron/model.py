"""HF config -> megatron-core TransformerConfig, and the GPTModel chunks built from it.

Supported architectures are the Llama family of decoders that megatron's GPTModel computes exactly:
RMSNorm, SwiGLU MLP, rotary embeddings, GQA; Qwen2 adds a QKV bias, Qwen3 adds per-head q/k RMSNorm
and an explicit head_dim, Qwen3-MoE swaps every MLP for a softmax top-k router over experts.
Weights always come from the HF checkpoint (`weights.load_hf_weights`), so nothing is initialised here.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from dagrl.backends.megatron.probes import transformer_engine_available
from dagrl.backends.model_shape import ModelShape
from dagrl.config.schema import MegatronConfig
from dagrl.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")
_MODEL_PATH_KEY = "actor_rollout_ref.model.path"
_TP_KEY = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"


def _rope(hf_config) -> tuple[float, dict[str, Any]]:
    """(rope_theta, rope_parameters): transformers 5.x keeps both in `rope_parameters`, 4.x on the config."""
    params = dict(
        getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    )
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ConfigError(_MODEL_PATH_KEY, hf_config.model_type, "config.json has no rope_theta")
    return float(theta), params


def rope_kwargs(hf_config) -> dict[str, Any]:
    """GPTModel's rotary arguments for the HF rope settings.

    Megatron implements default rope and Llama-3.1 scaling with its fixed constants
    (low 1, high 4, original context 8192); anything else would silently change the logits.
    """
    theta, params = _rope(hf_config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return {"rotary_base": theta}
    llama3_constants = (
        params.get("low_freq_factor"),
        params.get("high_freq_factor"),
        params.get("original_max_position_embeddings"),
    )
    if rope_type == "llama3" and llama3_constants == (1.0, 4.0, 8192):
        return {"rotary_base": theta, "rope_scaling": True, "rope_scaling_factor": float(params["factor"])}
    raise ConfigError(
        _MODEL_PATH_KEY,
        f"rope {params}",
        "the megatron backend supports default rope and llama3 scaling (low 1, high 4, context 8192); "
        "use actor_rollout_ref.actor.strategy=torch for this model",
    )


def _check_architecture(hf_config) -> None:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            _MODEL_PATH_KEY,
            model_type,
            f"the megatron backend supports model_type {list(SUPPORTED_MODEL_TYPES)}; "
            "use actor_rollout_ref.actor.strategy=torch for other models",
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ConfigError(
            _MODEL_PATH_KEY, hf_config.hidden_act, "only SwiGLU (hidden_act=silu) MLPs are supported"
        )
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        # Llama/Qwen3 put these biases on o_proj / the MLP too, which megatron's linears here lack
        raise ConfigError(
            _MODEL_PATH_KEY, "attention_bias/mlp_bias=True", "biased Llama/Qwen3 variants are not supported"
        )
    if getattr(hf_config, "use_sliding_window", False):
        raise ConfigError(
            _MODEL_PATH_KEY, "use_sliding_window=True", "sliding-window attention is not supported"
        )
    if model_type == "qwen3_moe" and (
        getattr(hf_config, "mlp_only_layers", None) or getattr(hf_config, "decoder_sparse_step", 1) != 1
    ):
        raise ConfigError(
            _MODEL_PATH_KEY,
            "mlp_only_layers/decoder_sparse_step",
            "the megatron backend needs every Qwen3-MoE layer to be sparse (decoder_sparse_step=1, no mlp_only_layers)",
        )


def _moe_fields(hf_config) -> dict[str, Any]:
    """Qwen3-MoE router: softmax over all experts then top-k, renormalised when norm_topk_prob.

    Megatron's `moe_router_pre_softmax=False` takes top-k logits then softmaxes them, which equals
    HF's softmax -> top-k -> renormalise; `pre_softmax=True` is HF without renormalisation.
    HF only adds the load-balancing loss when `output_router_logits` is on, so we mirror that.
    """
    if hf_config.model_type != "qwen3_moe":
        return {}
    aux = bool(getattr(hf_config, "output_router_logits", False))
    return {
        "num_moe_experts": hf_config.num_experts,
        "moe_router_topk": hf_config.num_experts_per_tok,
        "moe_ffn_hidden_size": hf_config.moe_intermediate_size,
        "moe_router_pre_softmax": not hf_config.norm_topk_prob,
        "moe_router_score_function": "softmax",
        "moe_router_load_balancing_type": "aux_loss" if aux else "none",
        "moe_aux_loss_coeff": float(hf_config.router_aux_loss_coef) if aux else 0.0,
        "moe_router_dtype": "fp32",
        # grouped GEMM and permute fusion live in TransformerEngine; the local experts are a loop
        "moe_grouped_gemm": transformer_engine_available(),
        "moe_permute_fusion": False,
    }


def _parallel_fields(m: MegatronConfig) -> dict[str, Any]:
    return {
        "tensor_model_parallel_size": m.tensor_model_parallel_size,
        "pipeline_model_parallel_size": m.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": m.virtual_pipeline_model_parallel_size,
        "context_parallel_size": m.context_parallel_size,
        "expert_model_parallel_size": m.expert_model_parallel_size,
        "expert_tensor_parallel_size": m.expert_tensor_parallel_size,
        # SP needs TP > 1; megatron rejects sequence_parallel with TP 1
        "sequence_parallel": m.sequence_parallel and m.tensor_model_parallel_size > 1,
        "recompute_granularity": m.recompute_granularity.value if m.recompute_granularity else None,
        "recompute_method": m.recompute_method.value if m.recompute_method else None,
        "recompute_num_layers": m.recompute_num_layers,
    }


def transformer_config(
    hf_config, m: MegatronConfig, *, params_dtype: torch.dtype, use_cpu_initialization: bool
):
    """Megatron TransformerConfig equivalent to `hf_config` (a transformers PretrainedConfig) under `m`."""
    from megatron.core.transformer import TransformerConfig

    _check_architecture(hf_config)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    fields: dict[str, Any] = {
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "ffn_hidden_size": hf_config.intermediate_size,
        "num_attention_heads": hf_config.num_attention_heads,
        "num_query_groups": hf_config.num_key_value_heads,
        "kv_channels": head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": hf_config.model_type == "qwen2",
        "qk_layernorm": hf_config.model_type in ("qwen3", "qwen3_moe"),
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "attention_softmax_in_fp32": True,
        "variable_seq_lengths": True,
        # megatron rejects the default allgather dispatcher with variable_seq_lengths, even without MoE
        "moe_token_dispatcher_type": "alltoall",
        # True although HF weights overwrite the values: megatron tags TP-sharded params
        # (`tensor_model_parallel`, partition dim/stride) only inside its init functions, and
        # untagged params count as TP duplicates in the grad norm (clipping went wrong under TP2)
        "perform_initialization": True,
        "use_cpu_initialization": use_cpu_initialization,
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        # the fused kernels need CUDA/apex; the unfused paths are exact
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        **_parallel_fields(m),
        **_moe_fields(hf_config),
    }
    return TransformerConfig(**fields)


def padded_vocab_size(hf_config, tcfg) -> int:
    """HF vocab_size rounded up to a multiple of TP, so each TP rank holds an equal slice.

    The extra rows are zero in the embedding and output layer; their logits are masked out of
    log-probs and entropy (see `logprobs.py`) and dropped on export, so results stay exact.
    """
    tp = tcfg.tensor_model_parallel_size
    return -(-hf_config.vocab_size // tp) * tp


@functools.cache
def _logits_model_class():
    """GPTModel whose forward, when given `labels`, returns the output layer's vocab-parallel
    logits [S, B, V/TP] untouched instead of a loss (the labels are not read).

    Without labels GPTModel returns `logits.transpose(0, 1).contiguous()`: a copy of the largest
    activation forward and another in backward, 7% of an update on a 0.5B model (H100 profile in
    docs/perf.md). The log-prob kernels index the [S, B] layout directly.
    """
    from megatron.core.models.gpt import GPTModel

    class GPTLogitsModel(GPTModel):
        _rope_from_position_ids = False

        def forward(self, *args, rope_from_position_ids: bool = False, **kwargs):
            """`rope_from_position_ids`: rotate each token by its position id instead of its column.
            GPTModel's rotary table is indexed by column (0 .. S-1); packed rows restart the
            positions at every sequence (core/packing.py). Rotary attention depends only on
            position differences, so columns would be exact in real arithmetic too, but a
            sequence placed late in a row would get cos/sin of larger angles (other fp rounding)."""
            self._rope_from_position_ids = rope_from_position_ids
            return super().forward(*args, **kwargs)

        def _preprocess(self, *args, **kwargs):
            out = super()._preprocess(*args, **kwargs)
            rotary = out[1]  # [S, 1, 1, dim] by column, None without rope (or on no stage here)
            if not self._rope_from_position_ids or rotary is None:
                return out
            positions = kwargs["position_ids"] if "position_ids" in kwargs else args[1]  # [B, S]
            # every position id is < S, so the by-column table covers them: no host sync
            per_token = rotary[:, 0, 0][positions.t()].unsqueeze(2)  # [S, B, 1, dim]
            return (out[0], per_token, *out[2:])

        def compute_language_model_loss(self, labels, logits):
            return logits

    return GPTLogitsModel


def build_model(hf_config, tcfg, layer_spec, *, vp_size: int | None) -> list:
    """One megatron GPTModel per virtual-pipeline stage of this rank (a single one without VPP).

    `layer_spec`: a layer ModuleSpec or block spec shared by every chunk, or a callable
    `vp_stage -> spec` for block specs that list each stage's layers (`vp_stage` None without VPP).
    Logits stay vocab-sharded over TP (`parallel_output=True`): logprobs are computed from the
    shards, so the full vocab is never gathered. Parameters are uninitialised until loaded.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    vocab = padded_vocab_size(hf_config, tcfg)
    # ModuleSpec is callable too, so test for the shared kinds rather than for callable()
    shared_spec = isinstance(layer_spec, (ModuleSpec, TransformerBlockSubmodules))
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    chunks = []
    for vp_stage in range(vp_size or 1):
        stage = vp_stage if vp_size else None
        chunk = _logits_model_class()(
            config=tcfg,
            transformer_layer_spec=layer_spec if shared_spec else layer_spec(stage),
            vocab_size=vocab,
            max_sequence_length=hf_config.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            parallel_output=True,
            share_embeddings_and_output_weights=tied,
            position_embedding_type="rope",
            vp_stage=stage,
            **rope_kwargs(hf_config),
        )
        chunks.append(chunk)
    return chunks


def model_shape(tcfg, vocab_size: int) -> ModelShape:
    """The shape of megatron's TransformerConfig `tcfg` as the FLOPs count reads it
    (dagrl/backends/flops.py); parameters are not counted here."""
    c = tcfg
    ffn = c.moe_ffn_hidden_size * c.moe_router_topk if c.num_moe_experts else c.ffn_hidden_size
    return ModelShape(
        hidden=c.hidden_size,
        layers=c.num_layers,
        heads=c.num_attention_heads,
        kv_heads=c.num_query_groups,
        head_dim=c.kv_channels,
        intermediate=ffn,
        vocab=vocab_size,
        tied=False,  # not read by the FLOPs count (the output layer's matmul counts either way)
        params=0,
    )
