"""dagrl's sdpa layer spec computes what megatron's local spec computes, on CPU under gloo.

Each check runs in spawned gloo processes (tests/megatron_cpu_patch.py) so megatron's
parallel state and the CPU patches never leak into the pytest process.
"""

from __future__ import annotations

import pytest
import torch

cpu_patch = pytest.importorskip("tests.megatron_cpu_patch")

VOCAB, SEQ, BATCH = 96, 12, 3


def _config(tp: int = 1, sequence_parallel: bool = False, **overrides):
    """A tiny Qwen-shaped config: GQA, qkv bias (Qwen2), q/k norm (Qwen3), SwiGLU, RMSNorm."""
    fields = dict(
        kv_channels=16,
        ffn_hidden_size=96,
        layernorm_epsilon=1e-6,
        add_qkv_bias=True,
        qk_layernorm=True,
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
    )
    return cpu_patch.tiny_gpt_config(**(fields | overrides))


def _gpt(config, layer_spec):
    """GPTModel returning full-vocab logits [b, s, V] (gathered across TP)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        parallel_output=False,
    )


def _batch(padded: bool):
    """input_ids [b, s], position_ids [b, s], labels [b, s], mask [b, 1, s, s] (True = masked).

    The causal mask is always returned: megatron's local attention builds its default causal
    mask on CUDA, so the local model always gets it explicitly while sdpa gets None.
    """
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)
    mask = causal.expand(BATCH, 1, SEQ, SEQ).clone()
    position_ids = torch.arange(SEQ).expand(BATCH, SEQ).clone()
    if padded:  # left padding of 0, 3 and 7 tokens; a position always sees itself
        pad = torch.tensor([0, 3, 7])
        is_pad = torch.arange(SEQ)[None, :] < pad[:, None]  # [b, s]
        mask |= is_pad[:, None, None, :]
        mask &= ~torch.eye(SEQ, dtype=torch.bool)
        position_ids = (position_ids - pad[:, None]).clamp(min=0)
    return input_ids, position_ids, labels, mask


def _loss_and_grads(model, input_ids, position_ids, labels, mask):
    """Mean token NLL; returns (loss, logits [b, s, V], {name: grad})."""
    logits = model(input_ids, position_ids, mask)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    loss = -logprobs.gather(-1, labels[..., None]).mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), logits.detach(), grads


def _compare_with_local(rank: int, world_size: int, padded: bool) -> dict:
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from dagrl.backends.megatron.spec import get_sdpa_block_spec

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = _config()
    sdpa = _gpt(config, get_sdpa_block_spec(config, qk_layernorm=True))
    local_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    local = _gpt(config, local_spec)
    missing, unexpected = local.load_state_dict(sdpa.state_dict(), strict=False)
    input_ids, position_ids, labels, mask = _batch(padded)
    sdpa_mask = mask if padded else None
    return {
        "sdpa_keys": sorted(n for n, _ in sdpa.named_parameters()),
        "local_keys": sorted(n for n, _ in local.named_parameters()),
        "missing": missing,
        "unexpected": [k for k in unexpected if not k.endswith("_extra_state")],
        "sdpa": _loss_and_grads(sdpa, input_ids, position_ids, labels, sdpa_mask),
        "local": _loss_and_grads(local, input_ids, position_ids, labels, mask),
    }


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "left_padded"])
def test_sdpa_spec_matches_local_spec(padded: bool) -> None:
    (out,) = cpu_patch.run_distributed(_compare_with_local, 1, padded)
    assert out["sdpa_keys"] == out["local_keys"]
    assert not out["missing"] and not out["unexpected"]
    sdpa_loss, sdpa_logits, sdpa_grads = out["sdpa"]
    local_loss, local_logits, local_grads = out["local"]
    torch.testing.assert_close(sdpa_logits, local_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sdpa_loss, local_loss, rtol=1e-6, atol=1e-6)
    for name, grad in local_grads.items():
        torch.testing.assert_close(sdpa_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_rms_norm_marks_weight_for_sp_all_reduce() -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dagrl.backends.megatron.spec import RMSNorm

    kwargs = dict(num_layers=1, hidden_size=8, num_attention_heads=2, normalization="RMSNorm")
    kwargs |= dict(use_cpu_initialization=True, params_dtype=torch.bfloat16)
    config = TransformerConfig(**kwargs, tensor_model_parallel_size=2, sequence_parallel=True)
    norm = RMSNorm(config, hidden_size=8, eps=1e-6)
    assert norm.weight.sequence_parallel is True and norm.weight.dtype == torch.bfloat16
    x = torch.randn(5, 2, 8, dtype=torch.bfloat16)
    expected = torch.nn.functional.rms_norm(x.float(), (8,), eps=1e-6).to(torch.bfloat16)
    torch.testing.assert_close(norm(x), expected)
    config = TransformerConfig(**kwargs)
    assert RMSNorm(config, hidden_size=8).weight.sequence_parallel is False


def _tp_shard(name: str, full: torch.Tensor, param, rank: int, tp: int) -> torch.Tensor:
    """This TP rank's slice of a full (TP1) tensor for `param`.

    Fused qkv rows are grouped per query group, so plain chunks give each rank its groups;
    SwiGLU's fc1 is [gate; up], so each half is chunked separately.
    """
    if not getattr(param, "tensor_model_parallel", False):
        return full
    dim = param.partition_dim
    if name.endswith("linear_fc1.weight"):
        return torch.cat([half.chunk(tp, dim)[rank] for half in full.chunk(2, dim=0)], dim=0)
    return full.chunk(tp, dim)[rank]


def _sdpa_train_step(
    rank: int, world_size: int, sp: bool, reference: dict | None, device: str = "cpu"
) -> dict:
    """Loss and finalized grads of the sdpa model at TP=world_size, through megatron DDP.

    With `reference` (the TP1 run's weights and grads), loads this rank's weight shards and
    returns its grads next to the matching slices of the reference grads. Results are on CPU.
    """
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from dagrl.backends.megatron.spec import get_sdpa_block_spec

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    model_parallel_cuda_manual_seed(0)
    config = _config(tp=world_size, sequence_parallel=sp)
    model = _gpt(config, get_sdpa_block_spec(config, qk_layernorm=True)).to(device)
    params = dict(model.named_parameters())
    if reference is not None:
        with torch.no_grad():
            for name, param in params.items():
                full = reference["state"][name]
                param.copy_(_tp_shard(name, full, param, rank, world_size))
    state = {n: p.detach().cpu() for n, p in params.items()}
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), module=model)
    input_ids, position_ids, labels, mask = (t.to(device) for t in _batch(padded=True))
    logits = ddp(input_ids, position_ids, mask)
    loss = -torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None]).mean()
    loss.backward()
    finalize_model_grads([ddp])
    grads = {n: p.main_grad.detach().cpu() for n, p in params.items()}
    out = {"loss": loss.detach().cpu(), "state": state, "grads": grads}
    if reference is not None:
        full_grads = reference["grads"]
        out["expected"] = {n: _tp_shard(n, full_grads[n], p, rank, world_size) for n, p in params.items()}
        out["sp_marked"] = sorted(n for n, p in params.items() if getattr(p, "sequence_parallel", 0))
    return out


def test_tp2_sequence_parallel_matches_tp1() -> None:
    (reference,) = cpu_patch.run_distributed(_sdpa_train_step, 1, False, None)
    ranks = cpu_patch.run_distributed(_sdpa_train_step, 2, True, reference)
    for out in ranks:
        torch.testing.assert_close(out["loss"], reference["loss"], rtol=1e-5, atol=1e-6)
        for name, expected in out["expected"].items():
            torch.testing.assert_close(out["grads"][name], expected, rtol=1e-4, atol=1e-6, msg=name)
        # every RMSNorm weight (input, pre-MLP, q/k, final) is marked for the TP all-reduce
        assert len(out["sp_marked"]) == 4 * 2 + 1
