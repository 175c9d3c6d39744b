"""Mixed precision and optimizer CPU offload on one GPU: what fp32 master weights cost and buy, and a
Qwen3-4B-shape full-parameter update on one 80 GB card with the optimizer on the host.

Builds random Qwen3-shape checkpoints (tools/random_qwen3.py; no download), constructs the train
backend in this process (no Ray, no rollout), feeds it a synthetic GRPO batch (prompts of
--prompt-len, full --response-len responses, random advantages, old log-probs from its own forward)
and times `train_step` as the trainer calls it. Every measurement runs in a fresh process (clean
peaks) and prints one JSON line:

    python bench/mixed_precision_gpu.py torch                 # (a) 0.6B, torch: master / pure_bf16 / master_cpu
    python bench/mixed_precision_gpu.py megatron --shape 4b   # (b) 4B, megatron: cpu / resident
    python bench/mixed_precision_gpu.py torch --shape 4b --modes master_cpu

torch modes: `master` (the backend as it runs: bf16 weights, fp32 masters and Adam on the device),
`pure_bf16` (for measurement only: AdamW straight on the bf16 weights, what the backend did before
the masters; the bench swaps the optimizer in), `master_cpu` (actor.optimizer_cpu_offload=true).
megatron modes: `resident` (megatron's fp32 main params and Adam on the device), `cpu`
(megatron.optimizer_cpu_offload=true, fraction 1), `cpu_precision_aware` (+ use_precision_aware_optimizer,
needs TransformerEngine). A mode that runs out of memory prints its error as the JSON line.

Fields: frac_changed_compute = share of the bf16 weights that differ from the initial ones after
--steps updates at lr 1e-6; frac_changed_trained = the same for the weights the optimizer updates
(fp32 masters when there are any); step_s = median train_step seconds after the first;
peak_allocated_gib = torch's allocator peak in the process; device_memory_used_gib = card total - free
at the end (dagrl/backends/device_memory.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# hidden, layers, heads, kv heads, intermediate (vocabulary 151,936; tied below 4096 hidden)
SHAPES = {
    "0.6b": (1024, 28, 16, 8, 3072),
    "1.7b": (2048, 28, 16, 8, 6144),
    "4b": (2560, 36, 32, 8, 9728),
    "8b": (4096, 36, 32, 8, 12288),
    "tiny": None,  # the model that ships with dagrl: a smoke test of this script
}
MODES = {"torch": ("master", "pure_bf16", "master_cpu"), "megatron": ("cpu", "resident")}
A = "actor_rollout_ref.actor"
M = f"{A}.megatron"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backend", choices=sorted(MODES))
    p.add_argument(
        "--shape", choices=sorted(SHAPES), default=None, help="default: 0.6b (torch), 4b (megatron)"
    )
    p.add_argument("--modes", default=None, help="comma-separated; default: every mode of the backend")
    p.add_argument("--out", default="/tmp/dagrl_mixed_precision")
    p.add_argument("--rows", type=int, default=64, help="responses per update (one mini-batch)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-len", type=int, default=448)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test (--shape tiny)"
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def model_dir(args) -> str:
    from tools.random_qwen3 import build_random_qwen3

    if SHAPES[args.shape] is None:
        from dagrl.data.builtin import tiny_model_path

        return tiny_model_path()
    path = os.path.join(args.out, f"qwen3-{args.shape}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        start = time.perf_counter()
        hidden, layers, heads, kv, inter = SHAPES[args.shape]
        build_random_qwen3(path, hidden, layers, heads, kv, inter, 151936, head_dim=128)
        print(json.dumps({"built": path, "s": round(time.perf_counter() - start, 1)}), flush=True)
    return path


def config(args, path: str, mode: str):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dagrl.config.validate import resolve_defaults, validate
    from dagrl.main import CONF_DIR

    n = 8
    overrides = [
        f"actor_rollout_ref.model.path={path}",
        "actor_rollout_ref.model.dtype=bfloat16",
        f"{A}.optim.lr=1e-6",
        f"{A}.optim.lr_warmup_steps=0",
        f"trainer.device={args.device}",
        f"actor_rollout_ref.rollout.n={n}",
        f"data.train_batch_size={args.rows // n}",
        f"{A}.ppo_mini_batch_size={args.rows // n}",
        f"{A}.ppo_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
        f"data.max_prompt_length={args.prompt_len}",
        f"data.max_response_length={args.response_len}",
    ]
    if args.backend == "torch":
        overrides += ["actor_rollout_ref.model.gradient_checkpointing=true"]
        overrides += [f"{A}.optimizer_cpu_offload={mode == 'master_cpu'}"]
    else:
        overrides += [f"{A}.strategy=megatron", f"{M}.param_dtype=bfloat16"]
        overrides += [
            f"{M}.recompute_granularity=full",
            f"{M}.recompute_method=uniform",
            f"{M}.recompute_num_layers=1",
        ]
        overrides += [f"{M}.optimizer_cpu_offload={mode.startswith('cpu')}"]
        overrides += [f"{M}.use_precision_aware_optimizer={mode == 'cpu_precision_aware'}"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    resolve_defaults(cfg)
    validate(cfg)
    return cfg


class PureBf16AdamW:
    """For measurement only: AdamW on the bf16 weights themselves (the torch backend before its
    fp32 masters), with the surface the backend calls."""

    def __init__(self, model: torch.nn.Module, optim):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.inner = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)

    def step(self, max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        if torch.isfinite(norm):
            self.inner.step()
        return norm


def synthetic_batch(args, vocab: int):
    from dagrl.core.batch import Batch

    g = torch.Generator().manual_seed(0)
    rows, plen, rlen = args.rows, args.prompt_len, args.response_len
    return Batch(
        {
            "prompts": torch.randint(2, vocab, (rows, plen), generator=g),
            "prompt_mask": torch.ones(rows, plen, dtype=torch.long),
            "responses": torch.randint(2, vocab, (rows, rlen), generator=g),
            "response_mask": torch.ones(rows, rlen, dtype=torch.long),
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, rlen).contiguous(),
        }
    )


def build_backend(args, cfg, mode: str):
    from dagrl.core.worker import ParallelContext

    ctx = ParallelContext(0, 1, torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu"))
    if args.backend == "megatron":
        from dagrl.backends.megatron.train import MegatronTrainBackend

        return trained(MegatronTrainBackend, cfg, ctx), None
    from dagrl.backends.torch.train import TorchTrainBackend

    backend = trained(TorchTrainBackend, cfg, ctx)
    if mode == "pure_bf16":
        backend.optimizer = None  # frees the masters before the plain AdamW's state appears
        if args.device == "cuda":
            torch.cuda.empty_cache()
        backend.optimizer = PureBf16AdamW(backend.model, cfg.actor_rollout_ref.actor.optim)
    initial = [p.detach().to("cpu", copy=True) for p in backend.model.parameters()]
    return backend, initial


def changed(initial: list[torch.Tensor], tensors: list[torch.Tensor]) -> float:
    diff = sum(int((t.detach().cpu().to(i.dtype) != i).sum()) for i, t in zip(initial, tensors))
    return diff / sum(i.numel() for i in initial)


def changed_trained(initial: list[torch.Tensor], tensors: list[torch.Tensor]) -> float:
    diff = sum(int((t.detach().float().cpu() != i.float()).sum()) for i, t in zip(initial, tensors))
    return diff / sum(i.numel() for i in initial)


def measure(args, mode: str) -> dict:
    from dagrl.backends.device_memory import used_gib
    from dagrl.core.batch import Batch

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.set_device(0)
    cfg = config(args, model_dir(args), mode)
    start = time.perf_counter()
    backend, initial = build_backend(args, cfg, mode)
    build_s = time.perf_counter() - start
    batch = synthetic_batch(args, 151936 if SHAPES[args.shape] else 261)
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    old, _ = backend.forward_logprobs(batch.select(keys), "old_logprobs")
    batch = batch.union(Batch({"old_logprobs": old["old_logprobs"].float()}))
    seconds = []
    for _ in range(args.steps):
        sync()
        t = time.perf_counter()
        backend.train_step(batch)
        sync()
        seconds.append(time.perf_counter() - t)
    out = {
        "bench": "mixed_precision",
        "backend": args.backend,
        "shape": args.shape,
        "mode": mode,
        "rows": args.rows,
        "tokens_per_row": args.prompt_len + args.response_len,
        "build_s": round(build_s, 1),
        "step_s": round(statistics.median(seconds[1:] or seconds), 3),
        "steps_s": [round(s, 3) for s in seconds],
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "device_memory_used_gib": round(used_gib(), 2) if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    if initial is not None:
        params = list(backend.model.parameters())
        trained = getattr(backend.optimizer, "masters", params)
        out["params_b"] = round(sum(p.numel() for p in params) / 1e9, 3)
        out["frac_changed_compute"] = round(changed(initial, params), 4)
        out["frac_changed_trained"] = round(changed_trained(initial, trained), 4)
    return out


def main() -> None:
    args = parse_args()
    args.shape = args.shape or ("0.6b" if args.backend == "torch" else "4b")
    if args.child:
        print(json.dumps(measure(args, args.child)), flush=True)
        return
    model_dir(args)  # once, before the measurements
    modes = args.modes.split(",") if args.modes else MODES[args.backend]
    passed = [args.backend, "--shape", args.shape, "--out", args.out, "--device", args.device]
    for name in ("rows", "prompt_len", "response_len", "micro", "steps"):
        passed += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for mode in modes:
        cmd = [sys.executable, os.path.abspath(__file__), *passed, "--child", mode]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and lines:
            print(lines[-1], flush=True)
        else:
            error = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            print(
                json.dumps(
                    {
                        "bench": "mixed_precision",
                        "backend": args.backend,
                        "shape": args.shape,
                        "mode": mode,
                        "error": error[:300],
                    }
                ),
                flush=True,
            )


def trained(cls, cfg, ctx):
    """The train role's backend built as a worker builds it: its spec and the driver's objective."""
    from dagrl.config.role_specs import role_spec
    from dagrl.config.roles import Role
    from dagrl.objectives import role_objectives

    spec = role_spec(cfg, Role.train)
    return cls(spec, ctx, role_objectives(cfg, [spec]).get(spec.name))


if __name__ == "__main__":
    main()
