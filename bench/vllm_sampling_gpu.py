"""What dagrl's way of asking vLLM for samples costs, on the engine alone (no trainer), on one GPU.

    python bench/vllm_sampling_gpu.py [--shape 0.6b] [--prompts 32] [--n 8] [--length 256] [--rounds 5]

The rollout's shape of the side-by-side (bench/acceptance_gpu.sh side, side_lora): a random
Qwen3 shape (bench/real_size_gpu.py build), 32 prompts of 160 tokens, n = 8 samples of 256 tokens
each (ignore_eos), temperature 1, the engine as dagrl starts it (in-process, external_launcher,
prefix caching, processed log-probs, no tokenizer). Each variant generates the same prompts
`--rounds` times after one warm-up round, the variants taking turns within each round; printed:
one JSON line per variant with every round's seconds and the median, then one line of ratios to
`per_request_seed`.

Variants:
  per_request_seed   what dagrl's rollout does (backends/vllm/rollout.py): every request its own
                     seed, vLLM giving each of its n samples seed + i. vLLM 0.26 then draws each
                     row's noise with its own generator, one kernel per row per decoded token.
  engine_seed        no per-request seed; the process's CUDA generator seeded before each
                     generate (torch.cuda.manual_seed), as an engine-level alternative would.
                     Also checked: two rounds with one seed give the same tokens.
  no_logprobs        engine_seed without the sampled tokens' log-probs (logprobs=None).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="0.6b")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-length", type=int, default=160)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="/tmp/dagrl_models")
    args = p.parse_args()

    import torch
    from real_size_gpu import build

    from dagrl.backends.vllm.engine import start_engine

    model = build(args.models, args.shape)
    llm, _, start_s = start_engine(
        dict(
            model=model,
            dtype="bfloat16",
            seed=1,
            max_model_len=args.prompt_length + args.length,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            gpu_memory_utilization=0.3,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=True,
            generation_config="vllm",
            distributed_executor_backend="external_launcher",
            disable_custom_all_reduce=True,
            disable_log_stats=True,
        ),
        rank=0,
        world_size=1,
    )
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    g = torch.Generator().manual_seed(0)
    prompts = [
        TokensPrompt(prompt_token_ids=torch.randint(10, 150000, (args.prompt_length,), generator=g).tolist())
        for _ in range(args.prompts)
    ]
    base = dict(
        temperature=1.0, top_p=1.0, top_k=0, max_tokens=args.length, ignore_eos=True, detokenize=False
    )

    def params(variant: str, round_: int) -> list:
        logprobs = {} if variant == "no_logprobs" else dict(logprobs=0, flat_logprobs=True)
        if variant == "per_request_seed":
            seed = 1000 * round_
            return [
                SamplingParams(seed=seed + r * args.n, n=args.n, **base, **logprobs)
                for r in range(len(prompts))
            ]
        return [SamplingParams(n=args.n, **base, **logprobs) for _ in prompts]

    def generate(variant: str, round_: int) -> tuple[float, list]:
        if variant != "per_request_seed":
            torch.cuda.manual_seed(1000 * round_)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params(variant, round_), use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = [list(c.token_ids) for o in outputs for c in o.outputs]
        assert sum(map(len, tokens)) == args.prompts * args.n * args.length, "a response ended early"
        return seconds, tokens

    print(
        json.dumps(
            {"engine_start_s": round(start_s, 1), "model": model, "device": torch.cuda.get_device_name()}
        )
    )
    variants = ("per_request_seed", "engine_seed", "no_logprobs")
    for v in variants:
        generate(v, 0)  # warm-up: compile, CUDA graphs, prefix cache
    # rounds interleave the variants, so that what else runs on the host weighs on each alike
    seconds = {v: [] for v in variants}
    tokens = {v: [] for v in variants}
    for r in range(1, args.rounds + 1):
        for v in variants:
            s, t = generate(v, r)
            seconds[v].append(round(s, 3))
            tokens[v].append(t)
    _, again = generate("engine_seed", 1)
    medians = {}
    for v in variants:
        row = {"variant": v, "generate_s": seconds[v], "median_s": statistics.median(seconds[v])}
        row["tokens_per_s"] = round(args.prompts * args.n * args.length / row["median_s"])
        if v == "engine_seed":
            row["same_seed_same_tokens"] = again == tokens[v][0]
        medians[v] = row["median_s"]
        print(json.dumps(row), flush=True)
    ref = medians["per_request_seed"]
    print(json.dumps({"ratio_to_per_request_seed": {k: round(v / ref, 3) for k, v in medians.items()}}))


if __name__ == "__main__":
    main()
