"""dagrl.backends.megatron.optimizer: what megatron-core 0.16.1 builds from the CPU optimizer's
settings without the distributed optimizer, on two gloo ranks of a tiny bf16 GPT. It cannot step
(precision_rules.py refuses the setting for it, tests/config/test_precision_config.py); should a
megatron-core release step it, this test fails and the refusal can go."""

from __future__ import annotations

import pytest
import torch

from tests.megatron_cpu_patch import run_distributed, tiny_gpt_config

pytest.importorskip("megatron.core")


def _cpu_optimizer_replicated(rank: int, world: int, fraction: float) -> dict:
    """Build the CPU optimizer (megatron.optimizer_cpu_offload) as the backend does with
    use_distributed_optimizer=false, run one forward and backward, and step."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from dagrl.backends.megatron.optimizer import build_optimizer, optimizer_config
    from dagrl.config.schema import ActorConfig, MegatronConfig
    from tests.backends.megatron.test_checkpoint import BATCH, SEQ, VOCAB, _gpt, _no_cuda_stream

    with _no_cuda_stream():
        parallel_state.initialize_model_parallel()
        tensor_parallel.model_parallel_cuda_manual_seed(1)
        config = tiny_gpt_config(bf16=True, params_dtype=torch.bfloat16)
        gpt = _gpt(config).bfloat16()
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=False, grad_reduce_in_fp32=True)
        ddp = DistributedDataParallel(config, ddp_config, gpt)
        megatron = MegatronConfig(
            optimizer_cpu_offload=True, optimizer_offload_fraction=fraction, use_distributed_optimizer=False
        )
        [wrapper] = build_optimizer(
            optimizer_config(ActorConfig(), megatron, torch.bfloat16), [ddp]
        ).chained_optimizers
        hdo = wrapper.optimizer
        grouped = [p for g in hdo.param_groups for p in g["params"]]
        built = {
            "wrapper": type(wrapper).__name__,
            "inner": type(hdo).__name__,
            "params": sum(p.numel() for p in gpt.parameters()),
            "wrapper_fp32_copies": sum(p.numel() for g in wrapper.fp32_from_float16_groups for p in g),
            "own_fp32_copies": sum(p.numel() for p in hdo.param_to_fp32_param.values()),
            "known_to_its_step": sum(p in hdo.param_to_inner_param for p in grouped),
        }
        gen = torch.Generator().manual_seed(rank)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
        logits = ddp(tokens[:, :-1], torch.arange(SEQ).expand(BATCH, SEQ), mask)
        loss = vocab_parallel_cross_entropy(
            logits.float().transpose(0, 1).contiguous(), tokens[:, 1:].t().contiguous()
        )
        loss.mean().backward()
        ddp.finish_grad_sync()
        try:
            wrapper.step()
        except KeyError:
            built["step"] = "KeyError"
        else:
            built["step"] = "stepped"
    return built


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_cpu_optimizer_cannot_step_without_the_distributed_optimizer(fraction):
    """megatron builds the CPU optimizer (HybridDeviceOptimizer) over the bf16 parameters with an
    fp32 copy of each, then wraps it in Float16OptimizerWithFloat16Params, which makes fp32 copies
    of its own and swaps them into the CPU optimizer's groups: two fp32 masters a parameter, and
    none of the tensors in its groups is one its step knows (KeyError at the first step, whatever
    share is offloaded)."""
    for built in run_distributed(_cpu_optimizer_replicated, 2, fraction):
        assert (built["wrapper"], built["inner"]) == (
            "Float16OptimizerWithFloat16Params",
            "HybridDeviceOptimizer",
        )
        assert built["wrapper_fp32_copies"] == built["own_fp32_copies"] == built["params"]
        assert built["known_to_its_step"] == 0
        assert built["step"] == "KeyError"
