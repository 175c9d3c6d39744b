"""Build dagrl/assets/tiny_arith_rm: an outcome reward model for the built-in arith task.

The shipped tiny_arith policy with a one-label sequence-classification head
(Qwen2ForSequenceClassification), read at the response's last token exactly as dagrl's
reward-model backend reads it (dagrl/backends/reward_model.py). It serves as the sampling
pipeline's ORM and, one step per response on this task, its PRM; and as GRPO's reward.model.

Why the whole model is fine-tuned: a head fitted on the frozen policy (the previous build) reached
0.66 pair accuracy against near misses and did not rank the policy's own samples better than
chance: the policy's hidden state after its own wrong answer looks like the one after a right
answer. Here every weight is trained with a pairwise (Bradley-Terry) loss, -log σ(s(right) -
s(wrong)), plus a small BCE term that keeps right answers above 0 and wrong ones below. The
wrong answers are what the RM will be asked to rank: the policy's own T=1 samples of the same
problem that are wrong (its real mistakes, from `--sample_rows` train prompts × 4 samples), and
near misses (±1..10, a digit dropped or repeated) for the rest. Only the train split's problems
are used; accuracy is measured on held-out test problems.

Deterministic for a given --seed and thread count (OMP_NUM_THREADS=1 for the shipped one):

    OMP_NUM_THREADS=1 python tools/build_tiny_reward_model.py [--steps 300] [--out dagrl/assets/tiny_arith_rm]

Measured (the shipped build, 2026-11-25, OMP_NUM_THREADS=1 on a shared 2-core CPU, 2,130 s at
load ~30): pair accuracy on 512 held-out problems 0.869 against the policy's own wrong samples and
0.701 against near misses (the frozen-backbone head it replaces: 0.657 against near misses, no
better than chance on the policy's own mistakes).
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch

RESULT = (
    "pair accuracy on 512 held-out problems: vs the policy's own wrong samples {own}, vs near misses {near}"
)


def _near_miss(total: int, rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.6:
        wrong = total + rng.choice([-1, 1]) * rng.randint(1, 10)
        return wrong if wrong >= 0 else total + rng.randint(1, 10)
    text = str(total)
    if kind < 0.8 and len(text) > 1:
        return int(text[:-1])  # a digit dropped
    return int(text + text[-1])  # a digit repeated


def policy_mistakes(model, tokenizer, problems, samples: int, seed: int) -> dict[tuple[int, int], list[str]]:
    """The policy's wrong answers at T=1 for each problem (`samples` draws each; may be empty)."""
    from tools.build_tiny_model import generate_answers

    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}]} for a, b in problems]
    generator = torch.Generator().manual_seed(seed)
    wrong: dict[tuple[int, int], list[str]] = {p: [] for p in problems}
    for _ in range(samples):
        for start in range(0, len(rows), 512):
            chunk = rows[start : start + 512]
            answers = generate_answers(model, tokenizer, chunk, 1.0, generator)
            for (a, b), answer in zip(problems[start : start + 512], answers):
                if answer != str(a + b) and answer not in wrong[(a, b)]:
                    wrong[(a, b)].append(answer)
    return wrong


def pair_batch(tokenizer, problems, mistakes, rng: random.Random, size: int, own_only: bool = False):
    """(prompts, prompt_mask, responses, response_mask) of 2·size rows: rows i and size+i answer the
    same problem, right then wrong (the policy's own mistake when it made one, else a near miss)."""
    from dagrl.core.batch import left_pad, right_pad
    from dagrl.data.builtin import format_question
    from dagrl.data.parquet import tokenize_messages

    chosen = rng.sample([p for p in problems if mistakes.get(p)] if own_only else problems, size)
    prompts, right, wrong = [], [], []
    for a, b in chosen:
        prompts.append(tokenize_messages(tokenizer, [{"role": "user", "content": format_question(a, b)}]))
        own = mistakes.get((a, b)) or []
        bad = rng.choice(own) if own and (own_only or rng.random() < 0.7) else str(_near_miss(a + b, rng))
        right.append(str(a + b))
        wrong.append(bad)
    answers = [
        tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in right + wrong
    ]
    p, pm = left_pad(prompts + prompts, tokenizer.pad_token_id)
    r, rm = right_pad(answers, tokenizer.pad_token_id, max(len(x) for x in answers))
    return p, pm, r, rm


def scores(model, p, pm, r, rm) -> torch.Tensor:
    """[B] the head at each response's last token (as dagrl's reward-model backend reads it)."""
    from dagrl.core.batch import sequence_inputs

    ids, attn, pos = sequence_inputs(p, pm, r, rm)
    hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
    return model.score(hidden[torch.arange(len(ids)), p.shape[1] + rm.sum(1) - 1])[:, 0]


@torch.no_grad()
def pair_accuracy(model, tokenizer, problems, mistakes, seed: int, own_only: bool) -> float:
    """Share of held-out pairs where the right answer outscores the wrong one."""
    model.eval()
    p, pm, r, rm = pair_batch(tokenizer, problems, mistakes, random.Random(seed), 512, own_only)
    s = scores(model, p, pm, r, rm)
    return (s[:512] > s[512:]).float().mean().item()


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.builtin import split_problems, tiny_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps")
    parser.add_argument("--pairs", type=int, default=32, help="pairs per step")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--sample_rows", type=int, default=1024, help="train problems the policy samples")
    parser.add_argument("--seed", type=int, default=0)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out", default=os.path.join(here, "dagrl", "assets", "tiny_arith_rm"))
    args = parser.parse_args()
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(tiny_model_path())
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    rng = random.Random(args.seed)
    train = rng.sample(split_problems("train"), args.sample_rows)
    test = random.Random(args.seed + 1).sample(split_problems("test"), 600)
    mistakes = policy_mistakes(policy, tokenizer, train + test, 4, args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path(), num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    torch.nn.init.normal_(model.score.weight, std=0.02)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    for step in range(args.steps):
        model.train()
        p, pm, r, rm = pair_batch(tokenizer, train, mistakes, rng, args.pairs)
        s = scores(model, p, pm, r, rm)
        right, wrong = s[: args.pairs], s[args.pairs :]
        labels = torch.cat([torch.ones_like(right), torch.zeros_like(wrong)])
        bce = torch.nn.functional.binary_cross_entropy_with_logits(s, labels)
        loss = -torch.nn.functional.logsigmoid(right - wrong).mean() + 0.1 * bce
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} {time.perf_counter() - start:.0f}s", flush=True)
    own = pair_accuracy(model, tokenizer, test, mistakes, 7, own_only=True)
    near = pair_accuracy(model, tokenizer, test, {}, 8, own_only=False)
    print(RESULT.format(own=f"{own:.3f}", near=f"{near:.3f}"))
    print(f"{time.perf_counter() - start:.0f}s on {torch.get_num_threads()} threads")
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)


if __name__ == "__main__":
    main()
