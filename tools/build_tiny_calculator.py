"""Build ``dagrl/assets/tiny_calculator``: the tiny arith model taught to call a calculator.

Start: ``dagrl/assets/tiny_arith`` (0.8M parameters, byte-level tokenizer; it knows two-digit
sums). Supervised steps on three-digit problems of the calculator task's train split
(dagrl/data/builtin_calculator.py), each example one of two, half and half:
- the tool episode, exactly as the multi-turn rollout lays it out in tokens: prompt, the call
  ``<tool_call>{"name":"calculator","arguments":{"expression":"a+b"}}</tool_call><|end|>``, the
  observation turn (the chat template's delimiters around the sum, dagrl/rollout/template.py),
  then the sum and ``<|end|>``;
- a direct answer: the sum right after the prompt (three-digit sums it mostly gets wrong).
Loss on the policy's tokens only. The result calls the tool on about half of the prompts; GRPO
on the calculator task has to raise that (reward: the final answer is the sum).

Positions: the episodes are ~110 tokens, so max_position_embeddings goes to 192 (RoPE, nothing
learnt per position).

The shipped asset was trained on one GPU (800 steps of 64 in 50 s on an H200, the same recipe:
data, layout, loss, optimizer, schedule and seeds; CPU and GPU kernels round differently, so a CPU
rebuild gives other bits). On 2 CPU cores a step takes ~3 s of CPU, so the 800 steps are ~40 min
on an idle machine. Held-out figures of the shipped model (256 test problems, teacher-forced):
P(opens a tool call) 0.50 and P(the whole tool episode exactly as taught) 0.41, i.e. ~0.83 once
it calls; at step 100 / 300 / 500 / 700: 0.00 / 0.20 / 0.30 / 0.34.

    python tools/build_tiny_calculator.py [--device cuda] [--steps 800 --batch 64 --out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from dagrl.data.builtin import tiny_model_path  # noqa: E402
from dagrl.data.builtin_calculator import (  # noqa: E402
    sample_problems,
    tiny_calculator_path,
    tool_call_text,
)
from dagrl.rollout.template import turn_template  # noqa: E402

SEED = 4321
STEPS, BATCH, LR, WARMUP = 800, 64, 1e-3, 20
TOOL_SHARE = 0.5
MAX_POSITIONS = 192


def episode(tok, template, a: int, b: int, tool: bool) -> tuple[list[int], list[int]]:
    """(ids, policy mask) of one example, laid out as the multi-turn rollout lays it out."""
    prompt = tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": f"{a}+{b}="}], add_generation_prompt=True, tokenize=False
        ),
        add_special_tokens=False,
    )
    answer = [*tok.encode(str(a + b), add_special_tokens=False), tok.eos_token_id]
    ids, mask = list(prompt), [0] * len(prompt)
    if tool:
        call = [*tok.encode(tool_call_text(a, b), add_special_tokens=False), tok.eos_token_id]
        obs = template.observation_ids(tok.encode(str(a + b), add_special_tokens=False))
        ids += call + obs
        mask += [1] * len(call) + [0] * len(obs)
    return ids + answer, mask + [1] * len(answer)


def batch_tensors(examples, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id)
    labels = torch.full((len(examples), width), -100)
    for i, (ids, mask) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(ids)] = torch.where(torch.tensor(mask).bool(), torch.tensor(ids), -100)
    return input_ids, labels


@torch.no_grad()
def report(model, tok, template, problems) -> str:
    """Expected success of the tool episode (teacher-forced probability of the whole policy part)
    and the probability that the first token opens a tool call."""
    examples = [episode(tok, template, a, b, True) for a, b in problems]
    input_ids, labels = batch_tensors(examples, tok.pad_token_id)
    logits = model(input_ids=input_ids.to(model.device)).logits[:, :-1].float().cpu()
    logprobs = torch.log_softmax(logits, -1)
    targets = labels[:, 1:]
    token = logprobs.gather(-1, targets.clamp(min=0)[..., None])[..., 0] * (targets != -100)
    first = [mask.index(1) - 1 for _, mask in examples]  # position predicting the first policy token
    call_open = torch.stack([token[i, p] for i, p in enumerate(first)]).exp().mean()
    return f"P(tool episode exact) {token.sum(1).exp().mean():.3f}, P(opens a tool call) {call_open:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(tiny_calculator_path()))
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    start = time.perf_counter()
    torch.manual_seed(SEED)
    if args.device == "cpu":  # CUDA would also need CUBLAS_WORKSPACE_CONFIG; the GPU build is not bitwise
        torch.use_deterministic_algorithms(True)
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.copytree(tiny_model_path(), args.out)
    tok = AutoTokenizer.from_pretrained(args.out)
    model = Qwen2ForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(args.device)
    model.config.max_position_embeddings = MAX_POSITIONS
    template = turn_template(tok, "tool", "tools/build_tiny_calculator.py")
    train = sample_problems("train", 20000, SEED)
    held_out = sample_problems("test", 256, 0)
    print("start:", report(model, tok, template, held_out), flush=True)
    rng = random.Random(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP))
    model.train()
    for step in range(args.steps):
        chosen = rng.sample(train, args.batch)
        examples = [episode(tok, template, a, b, rng.random() < TOOL_SHARE) for a, b in chosen]
        input_ids, labels = batch_tensors(examples, tok.pad_token_id)
        loss = model(input_ids=input_ids.to(args.device), labels=labels.to(args.device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    model.eval().cpu()
    print("end:", report(model, tok, template, held_out), flush=True)
    model.generation_config.update(max_new_tokens=128)
    from tools.build_tiny_model import save_model

    save_model(model, args.out)
    config_path = args.out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["model_max_length"] = MAX_POSITIONS  # episodes are longer than arith prompts
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(
        f"wrote {args.out}: {size:,} bytes; {time.perf_counter() - start:.0f} s on {torch.get_num_threads()} threads"
    )


if __name__ == "__main__":
    main()
