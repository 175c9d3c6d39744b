"""megatron-core's own TP / PP / DP code runs on CPU under gloo with tests/megatron_cpu_patch.py.

Each test spawns 2 gloo ranks. Inside one spawn the reference (TP1/PP1/DP1, computed on
every rank) and the parallel run share the process, so the ~8 s megatron import is paid once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.megatron_cpu_patch import apply, run_distributed, tiny_gpt_config

SEED = 1234
VOCAB = 128
SEQ = 16
BATCH = 4
ATOL = 1e-5


def _build_model(
    tp: int = 1,
    pp: int = 1,
    num_layers: int = 2,
    tied: bool = False,
    sequence_parallel: bool = False,
    recompute: bool = False,
):
    """A tiny fp32 GPTModel chunk for this rank; parallel_state must be initialised (tp, pp).

    With sequence_parallel the spec swaps megatron's torch norms (which refuse SP) for
    `_SequenceParallelRMSNorm`; TP1 references pass it too so both sides build the same model.
    """
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = tiny_gpt_config(
        num_layers=num_layers,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sequence_parallel and tp > 1,
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
        pipeline_dtype=torch.float32,
    )
    # Same seed on every rank: with use_cpu_initialization each TP shard is cut from one
    # full master weight, so TP2's shards are exactly TP1's weights.
    tensor_parallel.model_parallel_cuda_manual_seed(SEED)
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=_sequence_parallel_spec(num_layers) if sequence_parallel else layer_spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        position_embedding_type="rope",
        share_embeddings_and_output_weights=tied,
    )


class _SequenceParallelRMSNorm:
    """torch RMSNorm whose weight megatron treats as sequence-parallel (grads summed over TP)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        norm.weight.sequence_parallel = config.sequence_parallel
        return norm


def _sequence_parallel_spec(num_layers: int):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer.submodules.input_layernorm = _SequenceParallelRMSNorm
    layer.submodules.pre_mlp_layernorm = _SequenceParallelRMSNorm
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=_SequenceParallelRMSNorm)


def _batch(batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [B, T], position_ids [B, T], labels [B, T]), identical on every rank."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=gen)
    positions = torch.arange(SEQ).expand(batch, SEQ)
    return tokens[:, :-1], positions, tokens[:, 1:]


def _causal_mask() -> torch.Tensor:
    """[1, 1, T, T] bool, True where attention is masked (megatron's convention)."""
    return torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]


def _loss(model, input_ids, positions, labels) -> torch.Tensor:
    """Mean token cross-entropy through megatron's vocab-parallel CE; logits are [B, T, V/tp]."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = model(input_ids, positions, _causal_mask())
    per_token = vocab_parallel_cross_entropy(logits.transpose(0, 1).contiguous(), labels.t().contiguous())
    return per_token.mean()


def _full_grads(model) -> dict[str, torch.Tensor]:
    """name -> grad with TP shards gathered back into the full (TP1) layout."""
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if getattr(param, "tensor_model_parallel", False) and tp > 1:
            shards = [torch.empty_like(grad) for _ in range(tp)]
            torch.distributed.all_gather(shards, grad.contiguous(), group=group)
            # A stride-s shard holds s interleaved pieces: piece j of rank r is global piece j*tp+r.
            stride, dim = param.partition_stride, param.partition_dim
            pieces = [shard.chunk(stride, dim=dim) for shard in shards]
            grad = torch.cat([pieces[r][j] for j in range(stride) for r in range(tp)], dim=dim)
        grads[name] = grad.detach().clone()
    return grads


def _tp_loss_and_grads(
    tp: int, sequence_parallel: bool = False, recompute: bool = False
) -> tuple[float, dict[str, torch.Tensor]]:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model = _build_model(tp=tp, sequence_parallel=sequence_parallel, recompute=recompute)
    loss = _loss(model, *_batch())
    loss.backward()
    if model.config.sequence_parallel:
        # What finalize_model_grads does under DDP: each TP rank saw half the sequence.
        for param in model.parameters():
            if getattr(param, "sequence_parallel", False):
                torch.distributed.all_reduce(
                    param.grad, group=parallel_state.get_tensor_model_parallel_group()
                )
    grads = _full_grads(model)
    parallel_state.destroy_model_parallel()
    return loss.item(), grads


def _tp2_vs_tp1(rank: int, world_size: int) -> tuple[float, float, dict, dict]:
    _check_apply_is_idempotent()
    loss1, grads1 = _tp_loss_and_grads(tp=1)
    loss2, grads2 = _tp_loss_and_grads(tp=2)
    return loss1, loss2, grads1, grads2


def _check_apply_is_idempotent() -> None:
    """run_distributed already applied the patches; more calls must not wrap anything twice."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    apply()
    apply()
    assert not hasattr(DistributedOptimizer.__init__.__wrapped__, "__wrapped__")


def test_tp2_matches_tp1():
    for loss1, loss2, grads1, grads2 in run_distributed(_tp2_vs_tp1, 2):
        assert abs(loss1 - loss2) < ATOL, (loss1, loss2)
        assert grads1.keys() == grads2.keys()
        for name in grads1:
            torch.testing.assert_close(grads2[name], grads1[name], atol=ATOL, rtol=1e-4, msg=name)


def _sp_tp2_vs_tp1(rank: int, world_size: int) -> tuple[float, float, dict, dict]:
    """TP1 against TP2 + sequence parallel + full activation recompute (megatron's RNG-restoring
    CheckpointFunction)."""
    loss1, grads1 = _tp_loss_and_grads(tp=1, sequence_parallel=True)
    loss2, grads2 = _tp_loss_and_grads(tp=2, sequence_parallel=True, recompute=True)
    return loss1, loss2, grads1, grads2


def test_sequence_parallel_and_recompute_tp2_matches_tp1():
    for loss1, loss2, grads1, grads2 in run_distributed(_sp_tp2_vs_tp1, 2):
        assert abs(loss1 - loss2) < ATOL, (loss1, loss2)
        for name in grads1:
            torch.testing.assert_close(grads2[name], grads1[name], atol=ATOL, rtol=1e-4, msg=name)


def test_import_is_light():
    """Importing the patch module pulls in no megatron (so it is safe as a Ray setup hook)."""
    code = "import sys, tests.megatron_cpu_patch; assert not [m for m in sys.modules if m.startswith('megatron')]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def _global_name(name: str, model) -> str:
    """A stage's param name -> its name in the PP1 model.

    `decoder.layers.{i}.` gets the stage's layer offset; a tied output weight on the last
    stage is a copy of the word embedding.
    """
    import re

    if name == "output_layer.weight" and model.share_embeddings_and_output_weights:
        return "embedding.word_embeddings.weight"
    layers = getattr(model.decoder, "layers", [])
    offset = layers[0].layer_number - 1 if len(layers) else 0
    return re.sub(r"^decoder\.layers\.(\d+)\.", lambda m: f"decoder.layers.{int(m[1]) + offset}.", name)


def _forward_step(data_iterator, model):
    """megatron's forward_step_func: returns (logits [B, T, V] or hidden states, loss_func)."""
    input_ids, positions, labels = next(data_iterator)
    output = model(input_ids, positions, _causal_mask())

    def loss_func(logits):
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        loss = vocab_parallel_cross_entropy(logits.transpose(0, 1).contiguous(), labels.t().contiguous())
        loss = loss.mean()
        return loss, {"loss": loss.detach()}

    return output, loss_func


def _pp_loss_and_grads(pp: int, weights: dict[str, torch.Tensor] | None, micro_batches: int):
    """PP run of a tied-embedding model through megatron's forward_backward_func.

    Returns (mean loss on the last stage else None, {global name: grad}, {global name: weight},
    the tied embedding/output weight as built, before `weights` are copied in).
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=pp)
    model = _build_model(pp=pp, num_layers=4, tied=True)
    tied_as_built = model.shared_embedding_or_output_weight().detach().clone()
    if weights is not None:  # PP stages draw their init in another order; copy PP1's weights
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(weights[_global_name(name, model)])
    input_ids, positions, labels = _batch()
    data = zip(input_ids.chunk(micro_batches), positions.chunk(micro_batches), labels.chunk(micro_batches))
    stats = get_forward_backward_func()(
        forward_step_func=_forward_step,
        data_iterator=iter(list(data)),
        model=[model],
        num_microbatches=micro_batches,
        seq_length=SEQ,
        micro_batch_size=BATCH // micro_batches,
    )
    loss = torch.stack([s["loss"] for s in stats]).mean().item() if stats else None
    grads = {_global_name(n, model): p.grad.clone() for n, p in model.named_parameters()}
    params = {_global_name(n, model): p.detach().clone() for n, p in model.named_parameters()}
    parallel_state.destroy_model_parallel()
    return loss, grads, params, tied_as_built


def _pp2_vs_pp1(rank: int, world_size: int):
    loss1, grads1, weights1, _ = _pp_loss_and_grads(pp=1, weights=None, micro_batches=2)
    loss2, grads2, _, tied2 = _pp_loss_and_grads(pp=2, weights=weights1, micro_batches=2)
    return loss1, loss2, grads1, grads2, tied2


def test_pp2_matches_pp1():
    (loss1, first_loss, grads1, first_grads, first_tied), (_, last_loss, _, last_grads, last_tied) = (
        run_distributed(_pp2_vs_pp1, 2)
    )
    # megatron's embedding-group all-reduce gave the last stage the first stage's embedding.
    torch.testing.assert_close(last_tied, first_tied, atol=0, rtol=0)
    assert first_loss is None and abs(last_loss - loss1) < ATOL, (loss1, last_loss)
    assert first_grads.keys() | last_grads.keys() == grads1.keys()
    for name, grad1 in grads1.items():
        # A tied weight's grad is split between the stages: embedding on the first, head on the last.
        grad2 = sum(grads[name] for grads in (first_grads, last_grads) if name in grads)
        torch.testing.assert_close(grad2, grad1, atol=ATOL, rtol=1e-4, msg=name)


LR, CLIP = 1e-2, 0.1
# Adam's eps well above the noise of a gradient summed in another order: with 1e-8, an element whose
# gradient is ~0 moves by ±lr on its sign alone, so DP2's reduce-scatter order decided the weight
# (seen on a 2-core box whose kernels summed differently); the update stays linear in the gradient
EPS = 1e-4


def _dp_adam_step(rank: int, world_size: int) -> tuple[float, dict[str, torch.Tensor]]:
    """One megatron DDP + distributed-optimizer Adam step on this rank's 1/world_size of the batch.

    Returns (grad norm the optimizer saw, {name: updated weight}).
    """
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    parallel_state.initialize_model_parallel()
    gpt = _build_model()
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    model = DistributedDataParallel(config=gpt.config, ddp_config=ddp_config, module=gpt)
    # weight_decay=0 keeps the reference free of megatron's no-decay-for-norms grouping rule.
    config = OptimizerConfig(
        optimizer="adam",
        lr=LR,
        adam_eps=EPS,
        weight_decay=0.0,
        clip_grad=CLIP,
        bf16=False,
        params_dtype=torch.float32,
        use_distributed_optimizer=True,
    )
    optimizer = get_megatron_optimizer(config, [model])
    model.zero_grad_buffer()
    optimizer.zero_grad()
    input_ids, positions, labels = (t.chunk(world_size)[rank] for t in _batch())
    _loss(model, input_ids, positions, labels).backward()
    finalize_model_grads([model])  # the DP reduce-scatter of the grad buffers
    updated, grad_norm, _ = optimizer.step()  # then the all-gather of the updated params
    assert updated
    weights = {name: p.detach().clone() for name, p in gpt.named_parameters()}
    parallel_state.destroy_model_parallel()
    return grad_norm, weights


def _full_batch_adam_step() -> tuple[float, dict[str, torch.Tensor]]:
    """The DP1 reference: plain torch clip + Adam on the whole batch from the same init."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()  # DP2 world, but nothing here communicates
    model = _build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, eps=EPS)
    _loss(model, *_batch()).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
    optimizer.step()
    parallel_state.destroy_model_parallel()
    return grad_norm, {name: p.detach().clone() for name, p in model.named_parameters()}


def _dp2_vs_dp1(rank: int, world_size: int):
    return _full_batch_adam_step(), _dp_adam_step(rank, world_size)


def test_dp2_distributed_optimizer_matches_dp1():
    for (norm1, weights1), (norm2, weights2) in run_distributed(_dp2_vs_dp1, 2):
        assert norm1 > CLIP  # the clip really scaled the grads
        assert abs(norm2 - norm1) < 1e-5 * norm1, (norm1, norm2)
        for name, weight in weights1.items():
            torch.testing.assert_close(weights2[name], weight, atol=ATOL, rtol=1e-4, msg=name)


def _fail_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("boom on rank 1")
    torch.distributed.barrier()  # rank 0 waits on its dead peer until it is killed


def test_rank_exception_surfaces_with_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1.*_fail_on_rank_1.*ValueError: boom on rank 1"):
        run_distributed(_fail_on_rank_1, 2, timeout_s=60)
