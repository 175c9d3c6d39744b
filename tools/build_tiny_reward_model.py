"""Build dagrl/assets/tiny_arith_rm: a reward model for the built-in arith task.

The shipped tiny_arith policy's backbone with a one-label sequence-classification head
(Qwen2ForSequenceClassification), trained with a logistic loss to score a correct sum above a
wrong one: responses are the true sum or a near miss (±1..10, or a digit dropped/repeated), read
at the response's last token, exactly as dagrl's reward-model backend reads them
(dagrl/backends/reward_model.py). It serves as the sampling pipeline's ORM and, one step per
response on this task, its PRM; and as GRPO's reward.model in tests. Only the training split's
problems are used. Deterministic for a given --seed; a few minutes on 2 CPU cores.

    python tools/build_tiny_reward_model.py [--steps 300] [--out dagrl/assets/tiny_arith_rm]
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


def scores(model, p, pm, r, rm) -> torch.Tensor:
    """The head at each response's last token (what RewardModelBackend.score returns)."""
    from dagrl.core.batch import sequence_inputs

    ids, attn, pos = sequence_inputs(p, pm, r, rm)
    hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
    last = p.shape[1] + rm.sum(1) - 1
    return model.score(hidden[torch.arange(len(ids)), last])[:, 0]


def main() -> None:
    from transformers import AutoModelForSequenceClassification

    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.builtin import split_problems, tiny_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out", default=os.path.join(here, "dagrl", "assets", "tiny_arith_rm"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = load_tokenizer(tiny_model_path())
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path(), num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    train, test = split_problems("train"), split_problems("test")
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        *seq, labels = make_batch(tokenizer, train, rng, 32)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(scores(model, *seq), labels)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    model.eval()
    with torch.no_grad():
        *seq, labels = make_batch(tokenizer, test, random.Random(1), 512)
        accuracy = ((scores(model, *seq) > 0).float() == labels).float().mean().item()
    print(f"held-out (test split) pair accuracy: {accuracy:.3f}")
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)


if __name__ == "__main__":
    main()
