"""dagrl's megatron-core transformer layer spec for machines without TransformerEngine.

megatron-core's own fallback (`get_gpt_layer_local_spec`) has two gaps that matter for us:

- its `DotProductAttention` materialises the [b, heads, s, s] score matrix with baddbmm +
  softmax + bmm (unfused; measured MFU ~0.11 on an H100 for a 0.75B Qwen3-shaped model), and
- its torch norm wrapper asserts `not config.sequence_parallel`, so TP runs cannot use SP.

This module swaps in `SdpaAttention` (torch's fused `scaled_dot_product_attention`: flash /
memory-efficient kernels) and `RMSNorm` (fp32 math, weight marked for megatron's SP grad
all-reduce). Everything else (linears, MLP/MoE, rotary, bias-dropout-add) is megatron's local
implementation, so parameter names match the local spec one to one.

    layer = get_sdpa_layer_spec(qk_layernorm=True)             # one TransformerLayer
    block = get_sdpa_block_spec(config, qk_layernorm=True)     # layers + our final norm
    model = GPTModel(config, transformer_layer_spec=block, ...)
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
)

from dagrl.backends.megatron.probes import transformer_engine_available
from dagrl.config.schema import LayerSpec


class RMSNorm(torch.nn.Module):
    """RMSNorm over the last dim, computed in fp32; usable with sequence parallelism.

    Input [..., hidden_size] (megatron passes [s, b, h], or [s/tp, b, h] under SP), output
    the same shape and dtype. The weight lives in `config.params_dtype`.

    Under SP each TP rank normalises a different slice of the sequence, so each rank's weight
    grad is a partial sum. Megatron's `finalize_model_grads` all-reduces (sums) over the TP
    group every param with `param.sequence_parallel = True` when `config.sequence_parallel`;
    we set that attribute exactly like megatron's FusedLayerNorm does.

    The constructor takes what TransformerLayer / TransformerBlock / SelfAttention pass to a
    norm (`config, hidden_size, eps`) plus WrappedTorchNorm's unused extras.
    """

    def __init__(
        self,
        config: TransformerConfig,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ):
        super().__init__()
        assert config.normalization == "RMSNorm", (
            f"dagrl's sdpa layer spec only implements RMSNorm, got "
            f"config.normalization={config.normalization!r}; use layer_spec=local or te"
        )
        self.hidden_size = hidden_size
        self.eps = eps
        # zero-centred gamma stores (weight - 1) so weight decay pulls the scale towards 1.
        self.zero_centered_gamma = config.layernorm_zero_centered_gamma
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=config.params_dtype, device=device))
        self.reset_parameters()
        self.weight.sequence_parallel = config.sequence_parallel

    def reset_parameters(self) -> None:
        """Scale 1 (stored as 0 when zero-centred)."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[..., hidden_size] -> same shape and dtype."""
        shape = (self.hidden_size,)
        if hidden_states.dtype == self.weight.dtype and not self.zero_centered_gamma:
            # torch's fused kernel accumulates and scales in fp32 and rounds once at the end;
            # it only dispatches when input and weight dtypes match.
            return F.rms_norm(hidden_states, shape, self.weight, self.eps)
        weight = self.weight.float()
        if self.zero_centered_gamma:
            weight = weight + 1.0
        normed = F.rms_norm(hidden_states.float(), shape, weight, self.eps)
        return normed.to(hidden_states.dtype)


class SdpaAttention(MegatronModule):
    """Core attention through `torch.nn.functional.scaled_dot_product_attention`.

    A drop-in for megatron's `DotProductAttention` (same constructor and forward signature).
    Inputs as SelfAttention passes them: query [sq, b, nq, d], key/value [sk, b, nkv, d] with
    nq a multiple of nkv (GQA). Output [sq, b, nq * d].

    Masking follows DotProductAttention: an explicit `attention_mask` (bool, broadcastable to
    [b, 1, sq, sk], True = masked out) is used as given and must already include causality;
    without one, the layer's causal mask type means `is_causal=True`. Rows that mask every key
    are the caller's bug (local gives uniform weights there, SDPA on CPU zeros); keep at least
    the diagonal allowed.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ):
        super().__init__(config=config)
        _check_attention_config(config, layer_number)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        # apply_query_key_layer_scaling divides and re-multiplies the scale inside megatron's
        # softmax (an fp16 overflow trick); the net scale is unchanged, so we ignore it.
        self.softmax_scale = softmax_scale if softmax_scale is not None else config.kv_channels**-0.5
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        # Read by SelfAttention.clip_qk; we never track it (qk_clip is rejected above).
        self.current_max_attn_logits = None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        """q [sq, b, nq, d], k/v [sk, b, nkv, d], mask [b, 1, sq, sk] or None -> [sq, b, nq*d]."""
        assert packed_seq_params is None, "packed sequences (thd) need layer_spec=te"
        assert attention_bias is None, "attention_bias is not supported by the sdpa layer spec"
        sq, batch, n_query, head_dim = query.shape
        sk, n_kv = key.size(0), key.size(2)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        is_causal = attention_mask is None and mask_type == AttnMaskType.causal and sq > 1
        assert not is_causal or sq == sk, "causal attention without a mask needs sq == sk"
        # [s, b, n, d] -> [b, n, s, d]; SDPA kernels only need the last dim contiguous.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        sdpa_mask = None
        if attention_mask is not None:
            assert attention_mask.dtype == torch.bool, "megatron attention masks are bool"
            sdpa_mask = ~attention_mask  # megatron: True = masked out; SDPA: True = attend
        use_gqa = n_query != n_kv
        if use_gqa and sdpa_mask is not None:
            # The masked (memory-efficient) kernel has no GQA support; expanding keeps us off
            # the math fallback, which would materialise the full score matrix.
            k = k.repeat_interleave(n_query // n_kv, dim=1)
            v = v.repeat_interleave(n_query // n_kv, dim=1)
            use_gqa = False
        dropout_p = self.dropout_p if self.training else 0.0
        with self._dropout_rng(dropout_p):
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=sdpa_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=self.softmax_scale,
                enable_gqa=use_gqa,
            )
        return context.permute(2, 0, 1, 3).reshape(sq, batch, n_query * head_dim)

    def _dropout_rng(self, dropout_p: float) -> contextlib.AbstractContextManager:
        # Same RNG choice as DotProductAttention: heads differ per TP rank, so draw from the
        # model-parallel stream, except under SP where the block already forked it.
        if dropout_p > 0.0 and not self.config.sequence_parallel:
            return tensor_parallel.get_cuda_rng_tracker().fork()
        return contextlib.nullcontext()


def _check_attention_config(config: TransformerConfig, layer_number: int) -> None:
    """Reject the attention features SdpaAttention does not implement, naming the fix."""
    assert config.context_parallel_size == 1, (
        "context parallelism is not supported (the config refuses it before this point); "
        "set context_parallel_size=1"
    )
    assert config.window_size is None, "sliding-window attention needs layer_spec=te or local"
    assert config.softmax_type == "vanilla", (
        f"softmax_type={config.softmax_type!r} needs layer_spec=te or local"
    )
    assert not config.qk_clip, "qk_clip is not supported by the sdpa layer spec"
    assert config.kv_channels is not None, "config.kv_channels (head_dim) must be set"


def get_sdpa_layer_spec(
    *, num_experts: int | None = None, moe_grouped_gemm: bool = False, qk_layernorm: bool = False
) -> ModuleSpec:
    """A TransformerLayer spec: megatron's local linears/MLP, SDPA attention, our RMSNorm.

    Mirrors `get_gpt_layer_local_spec(normalization="RMSNorm")` so state-dict keys match it.
    `num_experts` selects megatron's local MoE (SequentialMLP, or GroupedMLP with
    `moe_grouped_gemm`). Note: GPTModel given only this layer spec builds its *final* norm
    from megatron's default (which rejects SP without TE/apex); use `get_sdpa_block_spec`.
    """
    backend = LocalSpecProvider()
    mlp = get_mlp_module_spec_for_backend(
        backend=backend, num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm
    )
    qk_norm = RMSNorm if qk_layernorm else IdentityOp
    # Same remapping as the local spec: checkpoints stay loadable by the TE spec, which
    # fuses these norms into the following linear.
    keys_map = {
        "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
        "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
    }
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=RMSNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=backend.column_parallel_linear(),
                    core_attention=SdpaAttention,
                    linear_proj=backend.row_parallel_linear(),
                    q_layernorm=qk_norm,
                    k_layernorm=qk_norm,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=RMSNorm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=keys_map if num_experts is None else {},
        ),
    )


def get_sdpa_block_spec(
    config: TransformerConfig,
    *,
    num_experts: int | None = None,
    moe_grouped_gemm: bool = False,
    qk_layernorm: bool = False,
    vp_stage: int | None = None,
    pp_rank: int | None = None,
) -> TransformerBlockSubmodules:
    """The decoder block spec for GPTModel: this stage's sdpa layers plus our final RMSNorm.

    GPTModel accepts it as `transformer_layer_spec`. Built per pipeline stage (and virtual
    stage `vp_stage`) because the block spec lists one layer spec per layer it builds.
    """
    layer = get_sdpa_layer_spec(
        num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm, qk_layernorm=qk_layernorm
    )
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=RMSNorm)


def layer_spec_for(choice: LayerSpec, tcfg, packing: bool = False):
    """The megatron layer spec for `megatron.layer_spec` (auto: TE when installed, else sdpa;
    sdpa with packing, whose block-diagonal mask the TE spec's causal attention would ignore)."""
    if choice == LayerSpec.auto:
        choice = LayerSpec.te if transformer_engine_available() and not packing else LayerSpec.sdpa
    if tcfg.num_moe_experts and not transformer_engine_available():
        import megatron.core.transformer.moe.moe_utils as moe_utils

        # megatron-core 0.16.1's router reads this TE name even when TE is absent (NameError)
        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
    kwargs = dict(num_experts=tcfg.num_moe_experts, qk_layernorm=tcfg.qk_layernorm)
    if choice == LayerSpec.te:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(moe_grouped_gemm=True, **kwargs)
    if choice == LayerSpec.local:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        return get_gpt_layer_local_spec(normalization="RMSNorm", **kwargs)
    # a block spec (per pipeline/virtual stage): it also gives the final norm sequence parallel
    return lambda vp_stage: get_sdpa_block_spec(tcfg, vp_stage=vp_stage, **kwargs)
