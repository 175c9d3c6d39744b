"""Build ``dagrl/assets/tiny_arith``: the tiny model that dagrl's default run trains with GRPO.

From scratch and seeded: a character-level tokenizer, a ~0.8M-parameter Qwen2-style model, and a
deliberately *brief* supervised pre-training on the train split of the built-in "arith" task.
Brief on purpose: the shipped model should often rank the right answer first (greedy accuracy
well above zero) while spreading probability over wrong digits (sampled accuracy low), which is
exactly what RL sharpens in a few dozen steps. Training to convergence would leave GRPO nothing
to learn; training less would leave it no reward to learn from.

Runs on 2 CPU cores in about a minute:  python tools/build_tiny_model.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from dagrl.data.builtin import generate_rows, split_problems, tiny_model_path  # noqa: E402

PAD, EOS, UNK = "<|pad|>", "<|end|>", "<|unk|>"
ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|system|>"]
SPECIAL_TOKENS = [PAD, EOS, *ROLE_TOKENS, UNK]  # ids 0..5, in this order
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MAX_POSITIONS = 64

SEED = 1234
PRETRAIN_STEPS = 240
PRETRAIN_BATCH = 128
PRETRAIN_LR = 3e-3
WARMUP_STEPS = 20
EVAL_ROWS = 512


def build_tokenizer(out_dir: Path) -> PreTrainedTokenizerBase:
    """Character-level tokenizer: each printable ASCII char and "\\n" is one token.

    ``tokenizer.json`` and ``tokenizer_config.json`` are written by hand (not by
    ``save_pretrained``) so they load the same on transformers 4.x and 5.x.
    """
    chars = ["\n"] + [chr(code) for code in range(32, 127)]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + chars)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # no spaces between characters on decode
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.save(str(out_dir / "tokenizer.json"))

    special_map = {
        "pad_token": PAD,
        "eos_token": EOS,
        "unk_token": UNK,
        "additional_special_tokens": ROLE_TOKENS,
    }
    added_tokens_decoder = {
        str(vocab[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": None,
        **special_map,
        "extra_special_tokens": ROLE_TOKENS,  # transformers 5 name of additional_special_tokens
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", special_map)
    return AutoTokenizer.from_pretrained(out_dir)


def build_model(tokenizer: PreTrainedTokenizerBase) -> Qwen2ForCausalLM:
    """A 4-layer Qwen2 small enough that a GRPO step on 128 samples takes well under a second on CPU."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return Qwen2ForCausalLM(config)


def sft_batch(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` [B, T] and ``labels`` [B, T], labels -100 outside answer + eos."""
    sequences, answer_masks = [], []
    for row in rows:
        prompt_ids = _prompt_ids(tokenizer, row)
        answer_ids = tokenizer.encode(row["reward_model"]["ground_truth"], add_special_tokens=False)
        answer_ids.append(tokenizer.eos_token_id)
        sequences.append(prompt_ids + answer_ids)
        answer_masks.append([False] * len(prompt_ids) + [True] * len(answer_ids))
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (seq, mask) in enumerate(zip(sequences, answer_masks)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(seq)] = torch.where(torch.tensor(mask), torch.tensor(seq), -100)
    return input_ids, labels


def pretrain(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, steps: int, lr: float) -> None:
    """Supervised pre-training on the whole train split, loss on answer tokens only."""
    rows = generate_rows("train", len(split_problems("train")), seed=SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_scale(step, steps))
    order = random.Random(SEED)
    model.train()
    for step in range(steps):
        input_ids, labels = sft_batch(tokenizer, order.sample(rows, PRETRAIN_BATCH))
        # Pads sit after each sequence, so causal attention never lets real tokens see them.
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 40 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {schedule.get_last_lr()[0]:.2e}", flush=True)
    model.eval()


def _lr_scale(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)))


@torch.no_grad()
def generate_answers(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict],
    temperature: float,
    generator: torch.Generator | None = None,
    max_new_tokens: int = 4,
) -> list[str]:
    """Decoded answers for ``rows``: greedy when ``temperature == 0``, else sampled at ``temperature``."""
    prompts = [_prompt_ids(tokenizer, row) for row in rows]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):  # left padding, so every row's next token is at column -1
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt) :] = 1
    done = torch.zeros(len(rows), dtype=torch.bool)
    for _ in range(max_new_tokens):
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[
            :, -1
        ]
        if temperature == 0:
            next_ids = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        next_ids = torch.where(done, tokenizer.pad_token_id, next_ids)
        input_ids = torch.cat([input_ids, next_ids[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, (~done).long()[:, None]], dim=1)
        done |= next_ids == tokenizer.eos_token_id
        if done.all():
            break
    return tokenizer.batch_decode(input_ids[:, width:], skip_special_tokens=True)


def accuracy(answers: list[str], rows: list[dict]) -> float:
    correct = sum(a == row["reward_model"]["ground_truth"] for a, row in zip(answers, rows))
    return correct / len(rows)


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(tiny_model_path()), help="model dir to (over)write")
    parser.add_argument("--steps", type=int, default=PRETRAIN_STEPS, help="pre-training steps")
    parser.add_argument("--lr", type=float, default=PRETRAIN_LR, help="peak pre-training learning rate")
    args = parser.parse_args()

    start = time.perf_counter()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    tokenizer = build_tokenizer(args.out)
    model = build_model(tokenizer)
    pretrain(model, tokenizer, args.steps, args.lr)
    model.generation_config.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=4)
    model.save_pretrained(args.out)
    build_seconds = time.perf_counter() - start

    test_rows = generate_rows("test", EVAL_ROWS, seed=0)
    greedy = accuracy(generate_answers(model, tokenizer, test_rows, temperature=0.0), test_rows)
    generator = torch.Generator().manual_seed(0)
    sampled = accuracy(generate_answers(model, tokenizer, test_rows, 1.0, generator), test_rows)
    params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out}: {params:,} params, {size:,} bytes on disk")
    print(f"test accuracy on {EVAL_ROWS} prompts: greedy {greedy:.3f}, sampled (T=1.0) {sampled:.3f}")
    print(
        f"build {build_seconds:.1f}s, total {time.perf_counter() - start:.1f}s on {torch.get_num_threads()} threads"
    )


if __name__ == "__main__":
    main()
