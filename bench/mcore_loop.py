"""A plain megatron-core training loop (no dagrl backend): ms/step, tokens/s, MFU, peak memory.

Builds a randomly initialised Qwen3-architecture GPTModel (GQA, q/k RMSNorm, SwiGLU, RoPE)
from command-line sizes, wraps it like megatron's own training does (Float16Module, megatron
DDP, distributed optimizer) and times `get_forward_backward_func()` + `optimizer.step()` on
synthetic tokens. TP/PP come from the launch: world = TP * PP * DP.

Defaults are Qwen3-0.6B's shape with an untied output layer (752M params):
hidden 1024, 28 layers, 16 heads, 8 query groups, head_dim 128, ffn 3072, vocab 151936.

    python bench/mcore_loop.py --spec sdpa                       # one GPU
    torchrun --nproc-per-node 2 bench/mcore_loop.py --tp 2 --sp --spec sdpa
    python bench/mcore_loop.py --device cpu --dtype fp32 --hidden 64 --layers 2 --heads 4 \
        --query-groups 2 --head-dim 16 --ffn 128 --vocab 256 --seq-len 32 --micro-batch 2 --steps 2

MFU counts 6 * matmul params (all but the input embedding) * tokens plus causal attention (6 * layers * heads * head_dim * seq per
token: QK^T and PV, forward + 2x backward, half the square) over `--peak-tflops` per GPU
(989 = H100/H200 bf16 dense). Prints one JSON line on global rank 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from functools import partial

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--query-groups", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--spec", choices=["local", "sdpa", "te"], default="sdpa")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--num-micro-batches", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallel (needs --tp > 1)")
    p.add_argument("--no-distributed-optimizer", action="store_true")
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="per-GPU dense peak")
    p.add_argument("--profile", help="after timing, profile one step; kernel table to this file")
    return p.parse_args(argv)


def init_distributed(device: str) -> None:
    """Join the torchrun world, or make a 1-process one; on CPU, install the test CPU patch."""
    if device == "cpu":
        # megatron-core assumes CUDA in places (rng tracker, buffers, optimizer type checks);
        # the test suite's patch makes it run on CPU. Never used on GPU.
        sys.path.insert(0, REPO_ROOT)
        try:
            from tests import megatron_cpu_patch
        except ImportError:
            print("tests/megatron_cpu_patch.py not found: megatron may need CUDA", file=sys.stderr)
        else:
            megatron_cpu_patch.apply()
    for key, default in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531")):
        os.environ.setdefault(key, default)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=10),
    )


def build_config(args: argparse.Namespace):
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    recompute = {} if args.recompute == "none" else {"recompute_granularity": args.recompute}
    if args.recompute == "full":
        recompute |= {"recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        num_query_groups=args.query_groups,
        kv_channels=args.head_dim,
        ffn_hidden_size=args.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        sequence_parallel=args.sp,
        use_cpu_initialization=args.device == "cpu",
        **recompute,
    )


def layer_spec(args: argparse.Namespace, config):
    """The GPTModel `transformer_layer_spec` for --spec."""
    from megatron.core.models.gpt import gpt_layer_specs

    if args.spec == "sdpa":
        from dagrl.backends.megatron.spec import get_sdpa_block_spec

        return get_sdpa_block_spec(config, qk_layernorm=True)
    if args.spec == "te":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=True)
    return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")


def build_model(args: argparse.Namespace, config):
    """GPTModel for this pipeline stage, wrapped in Float16Module (bf16) and megatron DDP."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(args, config),
        vocab_size=args.vocab,
        max_sequence_length=args.seq_len,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=args.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=1_000_000,
    )
    if args.device == "cuda":
        model.cuda(torch.cuda.current_device())
    if config.bf16:
        model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=not args.no_distributed_optimizer,
    )
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)


def build_optimizer(args: argparse.Namespace, config, model):
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-5,
        weight_decay=0.01,
        clip_grad=args.clip_grad,
        bf16=config.bf16,
        params_dtype=config.params_dtype,
        use_distributed_optimizer=not args.no_distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(opt_config, [model])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return optimizer


def synthetic_batch(args: argparse.Namespace) -> dict[str, torch.Tensor | None]:
    """Random tokens [b, s]; the causal mask is passed explicitly only on CPU (megatron's
    local attention builds its default one on CUDA; on GPU None lets sdpa use flash)."""
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else "cpu"
    gen = torch.Generator(device="cpu").manual_seed(0)
    shape = (args.micro_batch, args.seq_len)
    tokens = torch.randint(0, args.vocab, shape, generator=gen).to(device)
    mask = None
    if args.device == "cpu":
        causal = torch.ones(args.seq_len, args.seq_len, dtype=torch.bool).triu(1)
        mask = causal.expand(args.micro_batch, 1, -1, -1)
    return {
        "tokens": tokens,
        "labels": tokens.roll(-1, dims=1),
        "position_ids": torch.arange(args.seq_len, device=device).expand(shape),
        "attention_mask": mask,
    }


def _loss_func(output_tensor: torch.Tensor):
    """Per-token losses [b, s] -> (mean loss, logged dict)."""
    loss = output_tensor.float().mean()
    return loss, {"lm_loss": loss.detach()}


def forward_step(batch: dict, data_iterator, model):
    """megatron schedule callback: one micro-batch forward; the schedule runs the backward."""
    output = model(
        batch["tokens"],
        batch["position_ids"],
        batch["attention_mask"],
        labels=batch["labels"],
    )
    return output, _loss_func


def train_step(args: argparse.Namespace, model, optimizer, batch: dict) -> float:
    """One optimizer step over --num-micro-batches; returns its wall seconds."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    get_forward_backward_func()(
        forward_step_func=partial(forward_step, batch),
        data_iterator=None,
        model=[model],
        num_microbatches=args.num_micro_batches,
        seq_length=args.seq_len,
        micro_batch_size=args.micro_batch,
        forward_only=False,
    )
    update_ok, _grad_norm, _ = optimizer.step()
    assert update_ok, "optimizer step skipped (non-finite grads?)"
    sync()
    return time.perf_counter() - start


def profile_step(args: argparse.Namespace, model, optimizer, batch: dict) -> None:
    """One step under torch.profiler; rank 0 writes the top ops by device time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        train_step(args, model, optimizer, batch)
    if torch.distributed.get_rank() == 0:
        sort_by = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
        with open(args.profile, "w") as f:
            f.write(prof.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=90))


def flops_per_step(args: argparse.Namespace, num_params: int, dp: int) -> float:
    """Training FLOPs of one step across all ranks (see the module docstring)."""
    tokens = args.micro_batch * args.num_micro_batches * args.seq_len * dp
    attention_per_token = 6 * args.layers * args.heads * args.head_dim * args.seq_len
    # the input embedding is a lookup, not a matmul (same count as dagrl's megatron backend)
    matmul_params = num_params - (0 if args.tie_embeddings else args.vocab * args.hidden)
    return tokens * (6 * matmul_params + attention_per_token)


def count_params(model) -> int:
    """Total params of the full model (sums TP/PP shards; replicated params counted once)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    local = sum(p.numel() for p in model.parameters() if param_is_not_tensor_parallel_duplicate(p))
    device = next(model.parameters()).device
    total = torch.tensor(local, device=device, dtype=torch.float64)
    torch.distributed.all_reduce(total, group=parallel_state.get_model_parallel_group())
    return int(total.item())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    init_distributed(args.device)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(args.tp, args.pp)
    model_parallel_cuda_manual_seed(0)
    config = build_config(args)
    model = build_model(args, config)
    optimizer = build_optimizer(args, config, model)
    batch = synthetic_batch(args)
    times = [train_step(args, model, optimizer, batch) for _ in range(args.steps)]
    if args.profile:
        profile_step(args, model, optimizer, batch)
    step_s = statistics.median(times[args.warmup :] or times)
    dp = parallel_state.get_data_parallel_world_size()
    num_params = count_params(model)
    report = summarize(args, step_s, num_params, dp)
    if torch.distributed.get_rank() == 0:
        print(json.dumps(report), flush=True)
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def summarize(args: argparse.Namespace, step_s: float, num_params: int, dp: int) -> dict:
    world = torch.distributed.get_world_size()
    tokens = args.micro_batch * args.num_micro_batches * args.seq_len * dp
    peak_gib = 0.0
    if args.device == "cuda":
        peak = torch.tensor(torch.cuda.max_memory_allocated() / 2**30, device="cuda")
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        peak_gib = round(peak.item(), 2)
    mfu = flops_per_step(args, num_params, dp) / step_s / (args.peak_tflops * 1e12 * world)
    return {
        "spec": args.spec,
        "tp": args.tp,
        "pp": args.pp,
        "sp": args.sp,
        "dp": dp,
        "params": num_params,
        "tokens_per_step": tokens,
        "ms_per_step": round(step_s * 1e3, 1),
        "tokens_per_s": round(tokens / step_s),
        "mfu": round(mfu, 4),
        "peak_mem_gib": peak_gib,
        "steps": args.steps,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
    }


if __name__ == "__main__":
    main()
