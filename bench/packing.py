"""Sequence packing (actor_rollout_ref.model.use_remove_padding) against the padded layout, paired.

One train backend (torch or megatron) on a randomly initialised Qwen3-0.6B-shaped model; per
shape and pass the same backend runs the same batch padded and packed, alternating, so both see
the same weights, process and GPU. Passes:

- train: forward + backward over one mini-batch (the whole batch) in micro-batches, no
  optimizer step (`forward_backward`, what the update loop calls per mini-batch);
- logprob: `forward_logprobs` (the old/ref log-prob pass).

Shapes: side = 32 prompts x 8 samples, prompts of 125 tokens, responses uniform 32..256 (the
side-by-side GRPO shape); mixed = prompts 16..1024, responses 16..1024 tokens. One JSON line per
(shape, pass): seconds padded and packed (median of --repeats), ratio = packed / padded, real
tokens, the padded layout's pad fraction, what padding is left in the packed rows, peak memory.

    python bench/packing.py --backend torch
    python bench/packing.py --backend megatron
    python bench/packing.py --backend torch --device cpu   # smoke: tiny model, small shapes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QWEN3_06B = dict(hidden=1024, layers=28, heads=16, kv_heads=8, ffn=3072, vocab=151936)
TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512)
# name -> (prompts, samples, prompt lengths lo..hi, response lengths lo..hi, micro, log-prob micro)
SHAPES = {
    "side": (32, 8, (125, 125), (32, 256), 16, 32),
    "mixed": (16, 8, (16, 1024), (16, 1024), 8, 16),
}
SMOKE_SHAPES = {  # the same kinds of length mix, small
    "side": (2, 4, (12, 12), (4, 24), 8, 8),
    "mixed": (2, 4, (2, 40), (2, 40), 8, 8),
}
INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["torch", "megatron"], default="torch")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: smoke test, tiny model")
    p.add_argument("--shapes", default="side,mixed", help="comma-separated: side, mixed")
    p.add_argument("--passes", default="train,logprob", help="comma-separated: train, logprob")
    p.add_argument("--repeats", type=int, help="timed runs per layout after one warm-up (3; cpu: 1)")
    p.add_argument("--micro", type=int, help="train micro-batch rows (default: per shape)")
    p.add_argument("--logprob-micro", type=int, help="log-prob micro-batch rows (default: per shape)")
    p.add_argument("--out", default="/tmp/dagrl_packing_bench", help="where the random model is written")
    p.add_argument("extra", nargs="*", help="more dagrl overrides, e.g. actor_rollout_ref.actor.megatron.*")
    return p.parse_args(argv)


def build_model(out: str, sizes: dict, dtype: torch.dtype) -> str:
    """A random Qwen3 checkpoint of these sizes (head_dim 128 as Qwen3-0.6B; 16 in the tiny one)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    name = "qwen3-" + "-".join(
        str(sizes[k]) for k in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab")
    )
    path = os.path.join(out, name)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    config = Qwen3Config(
        hidden_size=sizes["hidden"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"],
        head_dim=128 if sizes["hidden"] >= 512 else 16,
        intermediate_size=sizes["ffn"],
        vocab_size=sizes["vocab"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(dtype).save_pretrained(path)
    return path


def synthetic_batch(shape: tuple, vocab: int, seed: int = 0):
    """Left-padded prompts and right-padded responses with lengths drawn uniformly per row."""
    from dagrl.core.batch import Batch

    prompts_n, samples, (p_lo, p_hi), (r_lo, r_hi), _, _ = shape
    rows = prompts_n * samples
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(p_lo, p_hi + 1, (prompts_n,), generator=g).repeat_interleave(samples)
    resp_lens = torch.randint(r_lo, r_hi + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(p_hi)[None] >= p_hi - prompt_lens[:, None]).long()
    response_mask = (torch.arange(r_hi)[None] < resp_lens[:, None]).long()
    return Batch(
        {
            "prompts": torch.randint(2, vocab, (rows, p_hi), generator=g) * prompt_mask,
            "prompt_mask": prompt_mask,
            "responses": torch.randint(2, vocab, (rows, r_hi), generator=g) * response_mask,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, r_hi, generator=g) * response_mask,
            "old_logprobs": -torch.rand(rows, r_hi, generator=g) * response_mask,
        }
    )


def make_backend(args, model_dir: str, shape: tuple):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dagrl.config.validate import resolve_defaults, validate
    from dagrl.core.worker import ParallelContext
    from dagrl.main import CONF_DIR

    prompts_n, samples, *_, micro, lp_micro = shape
    cuda = args.device == "cuda"
    dtype = "bfloat16" if cuda else "float32"
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.model.dtype={dtype}",
        f"actor_rollout_ref.actor.strategy={args.backend}",
        f"actor_rollout_ref.actor.megatron.param_dtype={dtype}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"trainer.device={args.device}",
        f"actor_rollout_ref.rollout.n={samples}",
        f"data.train_batch_size={prompts_n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts_n}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro or micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.logprob_micro or lp_micro}",
        *args.extra,
    ]
    if args.backend == "torch":
        overrides = [o for o in overrides if ".megatron." not in o]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    resolve_defaults(cfg)
    validate(cfg)
    ctx = ParallelContext(0, 1, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    if args.backend == "torch":
        from dagrl.backends.torch.train import TorchTrainBackend

        return trained(TorchTrainBackend, cfg, ctx)
    from dagrl.backends.megatron.train import MegatronTrainBackend

    return trained(MegatronTrainBackend, cfg, ctx)


def set_packing(backend, on: bool) -> None:
    """Both backends read the flag per micro-batch: one backend, one set of weights, two layouts."""
    backend.packing = on
    backend._step_micros = []  # megatron's per-step throughput record (train_step sets it up)


def run_pass(backend, name: str, batch) -> None:
    if name == "logprob":
        backend.forward_logprobs(batch.select(INPUTS), "old_logprobs")
        return
    micro_batches = batch.chunks(backend.settings.update.ppo_micro_batch_size_per_gpu)
    weights = backend.objective.micro_batch_weights(batch, micro_batches)
    for module in backend.model if isinstance(backend.model, list) else [backend.model]:
        module.train()  # megatron: its model chunks; torch: the HF model
    backend.forward_backward(micro_batches, weights)


def layout_tokens(args, backend, batch, micro: int) -> dict:
    """Real tokens, the padded layout's pad fraction and the packed rows' leftover padding."""
    from dagrl.core.packing import pack_sequences

    real = padded = packed = 0
    sp_tp = 1
    if args.backend == "megatron" and backend.m.sequence_parallel:
        sp_tp = backend.m.tensor_model_parallel_size
    for mb in batch.chunks(micro):
        p = pack_sequences(*(mb[k] for k in INPUTS), multiple=sp_tp)
        real += p.real_tokens
        packed += p.packed_tokens
        # torch runs [B, P + R]; megatron left-aligns and trims to the longest sequence
        padded += p.padded_tokens if args.backend == "torch" else len(mb) * p.input_ids.shape[1]
    return {"tokens": real, "pad_fraction": 1 - real / padded, "packed_pad_fraction": 1 - real / packed}


def timed(args, backend, name: str, batch, on: bool) -> tuple[float, float | None]:
    cuda = args.device == "cuda"
    set_packing(backend, on)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run_pass(backend, name, batch)
    if cuda:
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return time.perf_counter() - start, peak


def measure(args, backend, shape_name: str, shape: tuple, name: str, batch) -> dict:
    for on in (False, True) if args.device == "cuda" else ():  # warm-up: allocator, kernels, Triton
        timed(args, backend, name, batch, on)
    seconds = {False: [], True: []}
    peaks = {False: 0.0, True: 0.0}
    for i in range(args.repeats):
        for on in (False, True) if i % 2 == 0 else (True, False):
            s, peak = timed(args, backend, name, batch, on)
            seconds[on].append(s)
            peaks[on] = max(peaks[on], peak or 0.0)
    micro = (args.logprob_micro or shape[5]) if name == "logprob" else (args.micro or shape[4])
    padded_s, packed_s = statistics.median(seconds[False]), statistics.median(seconds[True])
    return {
        "backend": args.backend,
        "shape": shape_name,
        "pass": name,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "rows": len(batch),
        "micro": micro,
        "padded_s": round(padded_s, 4),
        "packed_s": round(packed_s, 4),
        "ratio": round(packed_s / padded_s, 3),
        **{k: round(v, 4) for k, v in layout_tokens(args, backend, batch, micro).items()},
        "padded_peak_gib": round(peaks[False], 2) if args.device == "cuda" else None,
        "packed_peak_gib": round(peaks[True], 2) if args.device == "cuda" else None,
    }


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    cuda = args.device == "cuda"
    args.repeats = args.repeats or (3 if cuda else 1)
    if args.backend == "megatron" and not cuda:
        from tests import megatron_cpu_patch  # megatron-core's CUDA assumptions, patched for CPU

        megatron_cpu_patch.apply()
    if cuda:
        torch.cuda.set_device(0)
    sizes = QWEN3_06B if cuda else TINY
    model_dir = build_model(args.out, sizes, torch.bfloat16 if cuda else torch.float32)
    shapes = SHAPES if cuda else SMOKE_SHAPES
    results = []
    backend = None
    for shape_name in args.shapes.split(","):
        shape = shapes[shape_name]
        if backend is None or args.backend == "torch":  # megatron's parallel state is built once
            backend = None  # the previous shape's model goes before the next one loads
            if cuda:
                torch.cuda.empty_cache()
            backend = make_backend(args, model_dir, shape)
        else:  # same model, this shape's micro-batch sizes
            backend.micro = args.logprob_micro or shape[5]
            backend.settings.update.ppo_micro_batch_size_per_gpu = args.micro or shape[4]
        batch = synthetic_batch(shape, sizes["vocab"])
        for name in args.passes.split(","):
            row = measure(args, backend, shape_name, shape, name, batch)
            print(json.dumps(row), flush=True)
            results.append(row)
    return results


def trained(cls, cfg, ctx):
    """The train role's backend built as a worker builds it: its spec and the driver's objective."""
    from dagrl.config.role_specs import role_spec
    from dagrl.config.roles import Role
    from dagrl.objectives import role_objectives

    spec = role_spec(cfg, Role.train)
    return cls(spec, ctx, role_objectives(cfg, [spec]).get(spec.name))


if __name__ == "__main__":
    main()
