"""Multi-turn rollout throughput on one GPU: generated (policy) tokens/s of episodes of T turns
with a tool latency between turns, against a single-turn rollout of the same total tokens, on
the same vLLM engine (one engine per process, so both run in this process, alternated).

    single      one request per episode of T × L tokens (no tools)
    multi       T turns of L tokens; after each, an environment step that takes --latency_ms
                (or runs the sandboxed python tool with --tool python), then a short observation;
                each episode's next request enters the running engine as soon as it is ready
    multi_sync  the same episodes, but turn-synchronous: every request of a turn waits for the
                slowest episode and its tools (what a batched loop does), to show what the
                continuous loop saves

Random weights never stop on their own: ignore_eos with multi_turn.max_tokens_per_turn = L
fixes every turn's length, so all three generate exactly episodes × T × L tokens.

usage: python tools/random_qwen3.py /tmp/qwen3_06b --hidden 1024 --layers 28 --heads 16 \
           --kv-heads 8 --intermediate 3072 --vocab 151936 --head-dim 128
       python bench/multi_turn_gpu.py --model /tmp/qwen3_06b [--episodes 256 --turns 4 --len 128
           --latency_ms 50 --reps 3 --tool sleep|python]
prints MULTI_TURN_GPU {...}; the goal is multi / single >= 0.8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dagrl.tools import StepResult, register_environment
from dagrl.tools.sandbox import run_python

OBSERVATION_ALLOWANCE = 32  # tokens per turn for the observation after it


class LatencyEnvironment:
    """Answers every turn with a short observation after a fixed latency, or after a real run of
    the sandboxed python tool."""

    latency_s, tool = 0.05, "sleep"

    def reset(self, row):
        return None

    def step(self, action):
        if self.tool == "python":
            out = run_python("print(sum(range(1000)))")
        else:
            time.sleep(self.latency_s)
            out = "ok"
        return StepResult(f"result: {out}", reward=0.0)


@register_environment("bench_latency")
def _latency(settings, tools, pool):
    return LatencyEnvironment()


def build(args):
    from dagrl.backends.vllm.rollout import VLLMRolloutBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import ParallelContext
    from tests.conftest import compose_config

    total = args.turns * args.len
    cfg = compose_config(
        f"actor_rollout_ref.model.path={args.model}",
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "data.max_prompt_length=32",
        # room for the observations between turns: "result: 499500" (--tool python) is 24 tokens with
        # the template's delimiters on the shipped byte-level tokenizer; 16 would cut the last turn
        f"data.max_response_length={total + args.turns * OBSERVATION_ALLOWANCE}",
        "trainer.device=cuda",
    )
    backend = VLLMRolloutBackend(role_spec(cfg, "rollout"), ParallelContext(0, 1, torch.device("cuda", 0)))
    return cfg, backend


def rollout(cfg, backend, args, turns: int, per_turn: int, synchronous: bool):
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.backends.vllm.engine_args import sampling_kwargs
    from dagrl.backends.vllm.multi_turn import VLLMStepSampler
    from dagrl.rollout.multi_turn import MultiTurnRollout

    mt = cfg.actor_rollout_ref.rollout.multi_turn
    mt.enable, mt.environment, mt.max_assistant_turns, mt.max_user_turns = True, "bench_latency", turns, turns
    mt.max_tokens_per_turn, mt.tool_workers = per_turn, args.episodes
    tok = load_tokenizer(args.model)
    runner = MultiTurnRollout(mt, tok, cfg.data.max_response_length, backend.eos_ids, backend.pad_id)
    sampler = (SyncSampler if synchronous else VLLMStepSampler)(
        backend.llm, sampling_kwargs(backend.spec, backend.eos_ids, False), 1 << 16
    )
    prompts = [tok.encode(f"{i}+{i + 1}=", add_special_tokens=False) for i in range(args.episodes)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    tensors, metrics = runner.generate(sampler, prompts, [{}] * len(prompts))
    seconds = time.perf_counter() - start
    tokens = int(tensors["response_mask"].sum())
    # random weights may still sample the tiny tokenizer's EOS id now and then (a stop token)
    assert tokens >= 0.98 * args.episodes * turns * per_turn, (tokens, metrics)
    return tokens / seconds, seconds


class SyncSampler:
    """VLLMStepSampler behind a barrier: a poll runs the engine until every request is done."""

    turn_synchronous = True

    def __init__(self, llm, kwargs, seed_base):
        from dagrl.backends.vllm.multi_turn import VLLMStepSampler

        self.inner = VLLMStepSampler(llm, kwargs, seed_base)
        self.submit, self.in_flight = self.inner.submit, self.inner.in_flight

    def poll(self):
        out = []
        while self.inner.in_flight():
            out += self.inner.poll()
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--len", type=int, default=128)
    p.add_argument("--latency_ms", type=float, default=50.0)
    p.add_argument("--tool", choices=("sleep", "python"), default="sleep")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gpu_memory_utilization", type=float, default=0.6)
    args = p.parse_args()
    LatencyEnvironment.latency_s, LatencyEnvironment.tool = args.latency_ms / 1000, args.tool
    cfg, backend = build(args)
    rollout(cfg, backend, args, 1, 16, False)  # warm-up: CUDA graphs, allocator
    runs = {"single": [], "multi": [], "multi_sync": []}
    for _ in range(args.reps):  # alternated, so each kind sees the same machine state
        runs["single"].append(rollout(cfg, backend, args, 1, args.turns * args.len, False))
        runs["multi"].append(rollout(cfg, backend, args, args.turns, args.len, False))
        runs["multi_sync"].append(rollout(cfg, backend, args, args.turns, args.len, True))
    med = {k: statistics.median(tps for tps, _ in v) for k, v in runs.items()}
    result = {
        "gpu": torch.cuda.get_device_name(0),
        **{k: vars(args)[k] for k in ("episodes", "turns", "len", "latency_ms", "tool")},
        **{f"{k}_tokens_per_s": round(v) for k, v in med.items()},
        **{f"{k}_s": round(statistics.median(s for _, s in v), 2) for k, v in runs.items()},
        "multi_over_single": round(med["multi"] / med["single"], 3),
        "sync_over_single": round(med["multi_sync"] / med["single"], 3),
    }
    print("MULTI_TURN_GPU " + json.dumps(result), flush=True)
    backend.shutdown()


if __name__ == "__main__":
    main()
