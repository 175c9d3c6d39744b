"""The built-in "arith" task and the tiny model shipped for it (dagrl/assets/tiny_arith)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dagrl.data.builtin import (
    BUILTIN_DATA_SOURCE,
    DEFAULT_TEST_ROWS,
    DEFAULT_TRAIN_ROWS,
    MAX_OPERAND,
    generate_rows,
    split_problems,
    tiny_model_path,
)
from dagrl.errors import DataError

# The shipped checkpoint's reason to exist: some reward at the start, plenty of room to climb.
SAMPLED_ACCURACY_BAND = (0.15, 0.45)
MIN_GREEDY_ACCURACY = 0.7


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()


@pytest.mark.parametrize("split", ["train", "test"])
def test_rows_are_well_formed(split):
    rows = generate_rows(split, 300, seed=7)
    assert len(rows) == 300
    for index, row in enumerate(rows):
        assert set(row) == {
            "data_source",
            "prompt",
            "ability",
            "reward_model",
            "extra_info",
            "teacher_prompt",
            "response",
        }
        assert row["data_source"] == BUILTIN_DATA_SOURCE
        assert row["ability"] == "arith"
        [message] = row["prompt"]
        assert message["role"] == "user"
        a, b = map(int, re.fullmatch(r"(\d+)\+(\d+)=", message["content"]).groups())
        assert 0 <= a <= MAX_OPERAND and 0 <= b <= MAX_OPERAND
        assert row["teacher_prompt"] == [
            {"role": "user", "content": f"{message['content']}? The answer is {a + b}. {message['content']}"}
        ]
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(a + b)}
        assert row["extra_info"] == {
            "split": split,
            "index": index,
            "question": message["content"],
            "answer": str(a + b),
        }
    assert len({r["prompt"][0]["content"] for r in rows}) == len(rows), "rows of one call are distinct"


def test_rows_are_deterministic_per_seed():
    assert generate_rows("train", 50, seed=1) == generate_rows("train", 50, seed=1)
    assert generate_rows("train", 50, seed=1) != generate_rows("train", 50, seed=2)


def test_splits_partition_all_problems_and_keep_mirrors_together():
    train, test = set(split_problems("train")), set(split_problems("test"))
    assert not train & test
    assert len(train | test) == (MAX_OPERAND + 1) ** 2
    assert 0.05 < len(test) / len(train | test) < 0.15
    assert all((b, a) in test for a, b in test), "b+a of a test problem must not be trained on"
    assert DEFAULT_TRAIN_ROWS <= len(train) and DEFAULT_TEST_ROWS <= len(test)


def test_whole_split_rows_are_disjoint_across_splits():
    def questions(split):
        return {r["extra_info"]["question"] for r in generate_rows(split, len(split_problems(split)), seed=0)}

    assert not questions("train") & questions("test")


def test_asking_for_more_rows_than_the_split_has_is_a_data_error():
    with pytest.raises(DataError, match="num_rows"):
        generate_rows("test", len(split_problems("test")) + 1, seed=0)
    with pytest.raises(DataError, match="split"):
        generate_rows("validation", 1, seed=0)


def test_tokenizer_is_character_level_and_round_trips(tokenizer):
    text = "".join(chr(c) for c in range(32, 127)) + "\n  two  spaces\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text), "every printable ASCII char and newline is one token"
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    unicode_text = "é€ ok"
    assert tokenizer.decode(tokenizer.encode(unicode_text, add_special_tokens=False)) == unicode_text


def test_tokenizer_special_tokens_and_chat_template(tokenizer):
    assert tokenizer.eos_token == "<|end|>" and tokenizer.pad_token == "<|pad|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    for token in ("<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token

    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "37+45="}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>add<|end|><|user|>37+45=<|end|><|assistant|>"
    no_prompt = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    assert no_prompt == "<|user|>37+45=<|end|>"

    ids = tokenizer.encode(text + "82<|end|>", add_special_tokens=True)
    assert ids[-1] == tokenizer.eos_token_id, "a response is the answer digits then eos"
    assert len(ids) == 1 + 3 + 1 + 1 + 6 + 1 + 1 + 2 + 1, "no bos or eos added implicitly"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "add37+45=82"


def test_shipped_model_config_and_size(model, tokenizer):
    config = model.config
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    size = sum(f.stat().st_size for f in Path(tiny_model_path()).iterdir())
    assert size <= 5 * 2**20


def test_shipped_model_gives_finite_logits(model, tokenizer):
    batch = tokenizer(
        ["<|user|>1+2=<|end|><|assistant|>", "<|user|>10+20=<|end|><|assistant|>"], padding=True
    )
    input_ids = torch.tensor(batch["input_ids"])
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.tensor(batch["attention_mask"])).logits
    assert logits.shape == (2, input_ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


@torch.no_grad()
def answer(model, tokenizer, rows: list[dict], generator: torch.Generator | None) -> list[str]:
    """Answers to ``rows``: sampled at T=1 with ``generator``, greedy when it is None."""
    texts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows
    ]
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    done = torch.zeros(len(rows), dtype=torch.bool)
    for _ in range(4):  # at most 3 digits and eos
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[
            :, -1
        ]
        if generator is None:
            next_ids = logits.argmax(-1)
        else:
            next_ids = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
        next_ids = torch.where(done, tokenizer.pad_token_id, next_ids)
        input_ids = torch.cat([input_ids, next_ids[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, (~done).long()[:, None]], dim=1)
        done |= next_ids == tokenizer.eos_token_id
    return tokenizer.batch_decode(input_ids[:, width:], skip_special_tokens=True)


def accuracy(answers: list[str], rows: list[dict]) -> float:
    return sum(a == r["reward_model"]["ground_truth"] for a, r in zip(answers, rows)) / len(rows)


def test_shipped_model_starts_with_low_sampled_but_high_greedy_accuracy(model, tokenizer):
    """Sampled accuracy in the band (reward > 0, room to climb); greedy high (RL can sharpen)."""
    rows = generate_rows("test", 64, seed=0)
    repeated = [row for row in rows for _ in range(4)]  # 4 samples a prompt: std of the mean ~0.03
    sampled = accuracy(answer(model, tokenizer, repeated, torch.Generator().manual_seed(0)), repeated)
    greedy = accuracy(answer(model, tokenizer, rows, None), rows)
    low, high = SAMPLED_ACCURACY_BAND
    assert low <= sampled <= high, f"sampled accuracy {sampled:.3f} outside {SAMPLED_ACCURACY_BAND}"
    assert greedy >= MIN_GREEDY_ACCURACY, f"greedy accuracy {greedy:.3f}"
