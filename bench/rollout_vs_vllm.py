"""dagrl's vLLM rollout against plain `vllm.LLM.generate`, in one process on one GPU.

Same engine (one per process), prompts, lengths and sampling parameters; the two are alternated
so each pair sees the same machine state, and the ratio of the pair is reported:
    ours  = VLLMRolloutBackend.generate on the collated batch (P prompts × n rows, per-request
            seeds, conversion to padded tensors; flat log-probs where calculate_log_probs asks for
            them, off by default) — what every rollout worker runs
    plain = llm.generate(P prompts, SamplingParams(n=n)) as a user would write it, with
            logprobs=0 exactly where ours asks for them
Then the weight refresh: an HF copy of the model on the GPU (the trainer's tensors) loaded into
the engine resident, and staged from sleep (sleep -> wake weights -> load -> wake KV cache).

usage: python bench/rollout_vs_vllm.py --model DIR --data FILE.parquet [--prompts 32 --n 8 --len 256 --reps 5]
prints ROLLOUT_VS_VLLM {...}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def rollout_config(args, *overrides: str):
    """The config the backend is built from: the side-by-side's model and rows at this shape,
    `overrides` last (bench/generate_spread.py's settings)."""
    from tests.conftest import compose_config

    return compose_config(
        f"actor_rollout_ref.model.path={args.model}",
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.sleep_level={args.sleep_level}",
        "actor_rollout_ref.rollout.ignore_eos=true",
        f"data.train_files={args.data}",
        f"data.val_files={args.data}",
        "data.max_prompt_length=160",
        f"data.max_response_length={args.len}",
        "trainer.device=cuda",
        *overrides,
    )


def build(args, *overrides: str):
    cfg = rollout_config(args, *overrides)
    return cfg, backend_of(cfg)


def backend_of(cfg):
    """The rollout role's vLLM backend on this process's first GPU, as a rollout worker builds it."""
    from dagrl.backends.vllm.rollout import VLLMRolloutBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import ParallelContext

    return VLLMRolloutBackend(role_spec(cfg, "rollout"), ParallelContext(0, 1, torch.device("cuda", 0)))


def batch_of(cfg, args):
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.parquet import PromptDataset
    from dagrl.trainer.loop import collate

    tok = load_tokenizer(args.model)
    data = PromptDataset([args.data], tok, max_prompt_length=160, prompt_key="prompt", filter_overlong=True)
    examples = [data[i] for i in range(args.prompts)]
    return collate(examples, tok.pad_token_id, args.n, 0), [e.prompt_ids for e in examples]


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = fn()
    torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


def rollout_pairs(backend, batch, prompt_ids, args) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    logprobs = {"logprobs": 0} if backend.settings.calculate_log_probs else {}  # the same work as ours
    plain_params = SamplingParams(n=args.n, max_tokens=args.len, ignore_eos=True, temperature=1.0, **logprobs)
    plain_prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]

    def ours():
        out, _ = backend.generate(batch, seed=7)
        return int(out["response_mask"].sum())

    def plain():
        outs = backend.llm.generate(plain_prompts, plain_params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    ours(), plain()  # warm-up (CUDA graphs, caches)
    rows = []
    for _ in range(args.reps):
        (t_ours, s_ours), (t_plain, s_plain) = timed(ours), timed(plain)
        rows.append(
            {
                "ours_tok_s": t_ours / s_ours,
                "plain_tok_s": t_plain / s_plain,
                "ours_s": s_ours,
                "plain_s": s_plain,
            }
        )
    ratios = [r["ours_tok_s"] / r["plain_tok_s"] for r in rows]
    return {
        "pairs": [{k: round(v, 3 if k.endswith("_s") else 0) for k, v in r.items()} for r in rows],
        "ratio_per_pair": [round(x, 3) for x in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
    }


def weight_refresh(backend, args) -> dict:
    """GB/s of new weights into the engine: resident, and staged from sleep (with memory per phase)."""
    from transformers import AutoModelForCausalLM

    from dagrl.backends.weight_sync import weight_buckets

    trainer = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda()
    out: dict = {}

    def refresh():
        buckets = weight_buckets(trainer.state_dict().items(), 256 * 2**20, to_cpu=False)
        return backend.load_weights(buckets)

    refresh()  # warm-up
    resident = [timed(refresh) for _ in range(3)]
    nbytes = resident[0][0]
    out["bytes"] = nbytes
    out["resident_GBps"] = [round(b / s / 1e9, 1) for b, s in resident]
    backend.finish_weight_update()  # prefix cache reset, as after every sync
    staged = []
    for _ in range(3):
        backend.offload()  # sleep
        torch.cuda.synchronize()
        start = time.perf_counter()
        backend.begin_weight_update()
        backend.load_weights(weight_buckets(trainer.state_dict().items(), 256 * 2**20, to_cpu=False))
        backend.finish_weight_update()
        torch.cuda.synchronize()
        staged.append(time.perf_counter() - start)
    out["staged_s"] = [round(s, 3) for s in staged]
    out["staged_GBps"] = [round(nbytes / s / 1e9, 1) for s in staged]
    out["memory_after_last_staged"] = {k: round(v, 2) for k, v in backend.memory.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--len", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--sleep-level", type=int, default=2)
    args = p.parse_args()
    t0 = time.perf_counter()
    cfg, backend = build(args)
    result = {"engine_start_s": round(time.perf_counter() - t0, 1), "device": torch.cuda.get_device_name()}
    batch, prompt_ids = batch_of(cfg, args)
    result["rows"] = len(batch)
    result["rollout"] = rollout_pairs(backend, batch, prompt_ids, args)
    result["refresh"] = weight_refresh(backend, args)
    print("ROLLOUT_VS_VLLM", json.dumps(result), flush=True)
    backend.shutdown()


if __name__ == "__main__":
    main()
