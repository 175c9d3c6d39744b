"""Build dagrl/assets/tiny_arith_rm: a reward model for the built-in arith task.

The shipped tiny_arith policy's backbone with a one-label sequence-classification head
(Qwen2ForSequenceClassification); the backbone is kept frozen and only the head is fitted, a
logistic regression scoring a correct sum above a wrong one: responses are the true sum or a near miss (±1..10, or a digit dropped/repeated), read
at the response's last token, exactly as dagrl's reward-model backend reads them
(dagrl/backends/reward_model.py). It serves as the sampling pipeline's ORM and, one step per
response on this task, its PRM; and as GRPO's reward.model in tests. Only the training split's
problems are used. Deterministic for a given --seed; about a minute of CPU time.

    python tools/build_tiny_reward_model.py [--rows 4096] [--out dagrl/assets/tiny_arith_rm]

Measured: held-out (test split) pair accuracy 0.657 (a correct sum vs a near miss, 50/50).
"""

from __future__ import annotations

import argparse
import os
import random

import torch


def _wrong(total: int, rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.6:
        return max(0, total + rng.choice([-1, 1]) * rng.randint(1, 10))
    text = str(total)
    if kind < 0.8 and len(text) > 1:
        return int(text[:-1])  # a digit dropped
    return int(text + text[-1])  # a digit repeated


def make_batch(tokenizer, problems, rng: random.Random, size: int):
    """(prompts, prompt_mask, responses, response_mask, labels) of `size` rows, half correct."""
    from dagrl.core.batch import left_pad, right_pad
    from dagrl.data.builtin import format_question
    from dagrl.data.parquet import tokenize_messages

    prompts, responses, labels = [], [], []
    for _ in range(size):
        a, b = rng.choice(problems)
        good = rng.random() < 0.5
        answer = a + b if good else _wrong(a + b, rng)
        prompts.append(tokenize_messages(tokenizer, [{"role": "user", "content": format_question(a, b)}]))
        responses.append(tokenizer.encode(str(answer), add_special_tokens=False) + [tokenizer.eos_token_id])
        labels.append(float(good))
    p, pm = left_pad(prompts, tokenizer.pad_token_id)
    r, rm = right_pad(responses, tokenizer.pad_token_id, max(len(x) for x in responses))
    return p, pm, r, rm, torch.tensor(labels)


def features(model, tokenizer, problems, rng: random.Random, rows: int):
    """Final hidden states at each response's last token, and labels, for `rows` pairs."""
    from dagrl.core.batch import sequence_inputs

    feats, labels = [], []
    with torch.no_grad():
        for _ in range(0, rows, 256):
            p, pm, r, rm, y = make_batch(tokenizer, problems, rng, 256)
            ids, attn, pos = sequence_inputs(p, pm, r, rm)
            hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
            feats.append(hidden[torch.arange(len(ids)), p.shape[1] + rm.sum(1) - 1])
            labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def main() -> None:
    from transformers import AutoModelForSequenceClassification

    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.builtin import split_problems, tiny_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096, help="training pairs")
    parser.add_argument("--steps", type=int, default=2000, help="head-fitting steps")
    parser.add_argument("--seed", type=int, default=0)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out", default=os.path.join(here, "dagrl", "assets", "tiny_arith_rm"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(tiny_model_path())
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path(), num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    # the backbone stays the policy's (frozen): its hidden state after reading the answer already
    # tells whether the answer is the one it would give; only the one-label head is fitted, on
    # features computed once (a logistic regression: seconds on a CPU)
    x, y = features(model, tokenizer, split_problems("train"), random.Random(args.seed), args.rows)
    mean, std = x.mean(0), x.std(0) + 1e-6
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    optim = torch.optim.Adam([w, b], lr=1e-2)
    for step in range(args.steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(((x - mean) / std) @ w + b, y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % 500 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    with (
        torch.no_grad()
    ):  # fold the standardisation into the head: score(h) = h @ (w/std) + (b - mean @ w/std)
        weight = w / std
        model.score.weight.copy_(weight[None])
        bias = (b - mean @ weight).item()
    # Qwen2's score head has no bias: the constant goes nowhere, and ranking needs none
    tx, ty = features(model, tokenizer, split_problems("test"), random.Random(1), 1024)
    with torch.no_grad():
        accuracy = (((model.score(tx)[:, 0] + bias) > 0).float() == ty).float().mean().item()
    print(f"held-out (test split) pair accuracy: {accuracy:.3f}")
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)


if __name__ == "__main__":
    main()
