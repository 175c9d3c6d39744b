"""dagrl.backends.megatron.checkpoint: save after step 1, load in fresh processes, step 2 matches.

Each case runs two spawns of gloo ranks: the first trains two steps (saving in between) and
records the weights after step 2; the second builds the model anew (other init seed), loads
and runs step 2. Exact fp32 equality shows model, fp32 main params, Adam moments and the step
count all came back.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.megatron_cpu_patch import run_distributed, tiny_gpt_config

VOCAB = 128
SEQ = 16
BATCH = 4


def _gpt(config):
    """The tiny GPT of these tests: local layers, RMSNorm, rope, untied output."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )


def _setup(tp: int, seed: int):
    """(ddp_model_chunks, optimizer) of a tiny fp32 GPTModel with the distributed optimizer."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    config = tiny_gpt_config(tensor_model_parallel_size=tp)
    gpt = _gpt(config)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), gpt)
    opt_cfg = OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True, bf16=False)
    return [ddp], get_megatron_optimizer(opt_cfg, [ddp])


def _step(model, optimizer, step: int) -> None:
    """One optimizer step on a batch that depends on `step` and the DP rank."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    gen = torch.Generator().manual_seed(100 * step + parallel_state.get_data_parallel_rank())
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    model[0].zero_grad_buffer()
    optimizer.zero_grad()
    logits = model[0](tokens[:, :-1], positions, mask)  # [B, T, V/tp]
    loss = vocab_parallel_cross_entropy(logits.transpose(0, 1).contiguous(), tokens[:, 1:].t().contiguous())
    loss.mean().backward()
    model[0].finish_grad_sync()
    ok, _, _ = optimizer.step()
    assert ok


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model[0].module.state_dict().items() if "_extra_state" not in k}


def _train_and_save(rank: int, world: int, tp: int, path: str) -> dict[str, torch.Tensor]:
    from dagrl.backends.megatron import checkpoint

    model, optimizer = _setup(tp, seed=1)
    _step(model, optimizer, 1)
    checkpoint.save(path, model, optimizer, {"steps": 1})
    _step(model, optimizer, 2)
    return _weights(model)


def _load_and_step(rank: int, world: int, tp: int, path: str) -> tuple[dict, dict]:
    from dagrl.backends.megatron import checkpoint

    model, optimizer = _setup(tp, seed=2)  # different init: everything must come from the checkpoint
    extra = checkpoint.load(path, model, optimizer)
    _step(model, optimizer, 2)
    return extra, _weights(model)


def _check_resume(world: int, tp: int, tmp_path) -> None:
    path = tmp_path / "ckpt"
    path.mkdir()
    expected = run_distributed(_train_and_save, world, tp, str(path))
    resumed = run_distributed(_load_and_step, world, tp, str(path))
    for want, (extra, got) in zip(expected, resumed):
        assert extra == {"steps": 1}
        assert want.keys() == got.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)


def test_resume_single_rank(tmp_path):
    _check_resume(world=1, tp=1, tmp_path=tmp_path)


def test_resume_dp2(tmp_path):
    _check_resume(world=2, tp=1, tmp_path=tmp_path)


def test_resume_tp2(tmp_path):
    _check_resume(world=2, tp=2, tmp_path=tmp_path)


def _train_tp2_fully_reshardable(rank: int, world: int, path: str, after: str, dp_only: str) -> None:
    from dagrl.backends.megatron import checkpoint

    model, optimizer = _setup(tp=2, seed=1)
    _step(model, optimizer, 1)
    checkpoint.save(path, model, optimizer, {"steps": 1}, checkpoint.OptimizerFormat.FULLY_RESHARDABLE)
    checkpoint.save(dp_only, model, optimizer, {"steps": 1})  # DP_RESHARDABLE
    _step(model, optimizer, 2)
    checkpoint.save(after, model, None, {"steps": 2})


def _resume_tp1_and_compare(
    rank: int, world: int, path: str, after: str, resumed: str, dp_only: str
) -> float:
    """Load the TP2 checkpoint into TP1, step; max |diff| of all weights to TP2's own step 2."""
    import pytest
    from megatron.core import dist_checkpointing

    from dagrl.backends.megatron import checkpoint
    from dagrl.errors import ConfigError

    model, optimizer = _setup(tp=1, seed=2)
    with pytest.raises(ConfigError, match="only change the DP size"):
        checkpoint.load(dp_only, model, optimizer)
    assert checkpoint.load(dp_only, model, None) == {"steps": 1}  # weights alone always reshard
    assert checkpoint.load(path, model, optimizer) == {"steps": 1}
    _step(model, optimizer, 2)
    checkpoint.save(resumed, model, None, {"steps": 2})
    # both as full (unsharded) tensors under megatron's global names
    want = _flatten(dist_checkpointing.load_plain_tensors(after))
    got = _flatten(dist_checkpointing.load_plain_tensors(resumed))
    assert want.keys() == got.keys() and "decoder.layers.self_attention.linear_qkv.weight" in want
    return max((got[k] - want[k]).abs().max().item() for k in want)


def _flatten(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    flat = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            flat[f"{prefix}{k}"] = v
    return flat


def test_tp2_checkpoint_resumes_in_tp1(tmp_path):
    """FULLY_RESHARDABLE: weights and Adam state of a TP2 run continue in TP1.

    DP_RESHARDABLE refuses the optimizer state across a TP change, but the weights load.
    """
    dirs = [tmp_path / name for name in ("step1", "step2", "resumed", "dp_only")]
    for d in dirs:
        d.mkdir()
    path, after, resumed, dp_only = map(str, dirs)
    run_distributed(_train_tp2_fully_reshardable, 2, path, after, dp_only)
    (diff,) = run_distributed(_resume_tp1_and_compare, 1, path, after, resumed, dp_only)
    # TP1 and TP2 sum in different orders (~1e-6); a lost Adam state would be off by ~lr = 1e-3
    assert diff < 1e-5, diff


@contextlib.contextmanager
def _no_cuda_stream():
    """torch.cuda.current_stream answers None on this CPU-only process (the only CUDA call of a
    never-stepped HybridDeviceOptimizer), and is restored after: the rank pool outlives the test."""
    real = torch.cuda.current_stream
    torch.cuda.current_stream = lambda *args, **kwargs: None
    try:
        yield
    finally:
        torch.cuda.current_stream = real


def _cpu_optimizer(seed: int, masters_on_host: bool = True):
    """(model, optimizer): a tiny bf16 GPT under the distributed optimizer over megatron's
    HybridDeviceOptimizer (megatron.optimizer_cpu_offload), never stepped; the fp32 masters on the
    host (use_precision_aware_optimizer, as the acceptance's 8B script plans it on 4 GPUs) or on
    the device.

    HybridDeviceOptimizer asks for the current CUDA stream when it is built or loaded into (it
    never uses it without a step): call this under `_no_cuda_stream()`."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    from dagrl.backends.megatron.optimizer import build_optimizer, optimizer_config
    from dagrl.config.schema import ActorConfig, MegatronConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    config = tiny_gpt_config(bf16=True, params_dtype=torch.bfloat16)
    # all 16-bit, as the backend's model: the optimizer's fp32 shards are copies then
    gpt = _gpt(config).bfloat16()
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
    model = [DistributedDataParallel(config, ddp_config, gpt)]
    megatron = MegatronConfig(
        optimizer_cpu_offload=True,
        use_distributed_optimizer=True,
        use_precision_aware_optimizer=masters_on_host,
    )
    optimizer = build_optimizer(optimizer_config(ActorConfig(), megatron, torch.bfloat16), model)
    [distributed] = optimizer.chained_optimizers
    assert isinstance(distributed.optimizer, HybridDeviceOptimizer) and not distributed.optimizer.state
    return model, optimizer


def _fresh_cpu_optimizer_is_loadable(rank: int, world: int) -> str:
    """The first call of a resume (`_sharded_state(..., is_loading=True)`) on a never-stepped CPU
    optimizer."""
    from dagrl.backends.megatron import checkpoint

    with _no_cuda_stream():
        model, optimizer = _cpu_optimizer(seed=1)
        state = checkpoint._sharded_state(model, optimizer, checkpoint.OptimizerFormat.DP_RESHARDABLE, True)
    return state["optimizer"]["param_state_sharding_type"]


def test_a_fresh_cpu_optimizer_can_be_resumed_into():
    """Without Apex or TransformerEngine (the GPU machines' install) megatron reads every
    parameter's Adam step to describe the optimizer, and a fresh HybridDeviceOptimizer has none:
    resuming with optimizer_cpu_offload failed there before the checkpoint was opened."""
    assert run_distributed(_fresh_cpu_optimizer_is_loadable, 1) == ["dp_reshardable"]


def _cpu_optimizer_after_resume(
    rank: int, world: int, path: str, masters_on_host: bool
) -> tuple[list, list, bool]:
    """Save a CPU optimizer as three steps leave it (each parameter's own step tensor at 3, its
    fp32 masters moved off the bf16 weights), load it into a fresh one (another init). Returns
    (distinct step tensors, their values) in the optimizer's state and in its CPU AdamWs' (what
    steps), and whether the fp32 tensors the AdamWs step hold the saved masters."""
    from dagrl.backends.megatron import checkpoint

    def stepped(hdo) -> list[torch.Tensor]:
        return [hdo.param_to_inner_param[p] for g in hdo.param_groups for p in g["params"]]

    with _no_cuda_stream():
        model, optimizer = _cpu_optimizer(seed=1, masters_on_host=masters_on_host)
        checkpoint._prime_adam_state(optimizer)
        hdo = optimizer.chained_optimizers[0].optimizer
        for s in hdo.state.values():
            s["step"] = torch.tensor(3.0)
        masters = stepped(hdo)
        assert all(m.dtype == torch.float32 for m in masters)
        for m in masters:
            m.add_(0.5)  # the masters are no copy of the bf16 weights
        saved = [m.clone() for m in masters]
        checkpoint.save(path, model, optimizer, {"steps": 3})
        model, optimizer = _cpu_optimizer(seed=2, masters_on_host=masters_on_host)
        checkpoint.load(path, model, optimizer)
    hdo = optimizer.chained_optimizers[0].optimizer
    held = [s["step"] for s in hdo.state.values()]
    steps = [s["step"] for sub in hdo.sub_optimizers for s in sub.state.values()]
    counts = [(len({id(t) for t in ts}), sorted({t.item() for t in ts})) for ts in (held, steps)]
    return counts[0], counts[1], all(torch.equal(a, b) for a, b in zip(stepped(hdo), saved))


@pytest.mark.parametrize("masters_on_host", [True, False], ids=["masters-on-host", "masters-on-device"])
def test_a_resumed_cpu_optimizer_steps_from_the_saved_state(tmp_path, masters_on_host):
    """megatron (no Apex/TE) loads one shared step tensor into every parameter's state (over
    dp_reshardable, the fresh optimizer's 0), which the CPU optimizer's per-parameter AdamWs would
    each advance. Every parameter has its own step at the saved count, in the state the AdamWs
    step with, and the fp32 masters they step are the saved ones; with the masters on the device
    (use_precision_aware_optimizer=false) megatron's load failed outright (build_optimizer). The
    GPU test of tests/backends/test_mixed_precision_gpu.py steps after a resume."""
    [((n_held, values_held), (n_stepped, values_stepped), masters)] = run_distributed(
        _cpu_optimizer_after_resume, 1, str(tmp_path), masters_on_host
    )
    assert values_held == values_stepped == [3.0]
    assert n_held == n_stepped > 1
    assert masters, "the AdamWs step the fresh optimizer's masters, not the saved ones"
