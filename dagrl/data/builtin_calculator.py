"""dagrl's built-in task "calculator": three-digit addition with a calculator tool, for the
multi-turn example (conf/experiment/multi_turn/calculator.yaml, data.builtin_task=calculator).

The shipped tiny model (``dagrl/assets/tiny_calculator``, built by
``tools/build_tiny_calculator.py``) only knows two-digit sums; it was taught the Hermes tool-call
format (``<tool_call>{"name":"calculator","arguments":{"expression":"345+678"}}</tool_call>``) on
half of its examples and to answer directly on the other half, so it starts out calling the
tool about half of the time. Answering three-digit sums unaided it is mostly wrong; through the
tool it copies the observation. GRPO has to learn to call the tool.

Every problem ``a+b`` with ``100 <= a, b <= 999`` belongs to one split by a stable hash of the
unordered pair, as in the arith task (dagrl/data/builtin.py).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from dagrl.errors import DataError

DATA_SOURCE = "dagrl/calculator"
LOW, HIGH = 100, 999
TEST_FRACTION_DENOM = 20
_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny_calculator"


def tiny_calculator_path() -> str:
    """Absolute path of the tiny model shipped for the calculator task (HF format)."""
    return str(_MODEL_DIR)


def tool_call_text(a: int, b: int) -> str:
    """The call the tiny model was taught for ``a+b`` (compact JSON, Hermes tags)."""
    call = {"name": "calculator", "arguments": {"expression": f"{a}+{b}"}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def _split_of(a: int, b: int) -> str:
    key = f"calc:{min(a, b)}+{max(a, b)}".encode()
    bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % TEST_FRACTION_DENOM
    return "test" if bucket == 0 else "train"


def sample_problems(split: str, num_rows: int, seed: int) -> list[tuple[int, int]]:
    """``num_rows`` distinct problems of ``split`` drawn in an order fixed by ``seed``."""
    if split not in ("train", "test"):
        raise DataError(f"built-in task {DATA_SOURCE}: unknown split {split!r}; use train or test")
    rng, seen, out = random.Random(f"calc:{split}:{seed}"), set(), []
    while len(out) < num_rows:  # ~810,000 problems: rejection sampling never runs dry
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        if (a, b) not in seen and _split_of(a, b) == split:
            seen.add((a, b))
            out.append((a, b))
    return out


def generate_rows(split: str, num_rows: int, seed: int, teacher_prompts: bool = True) -> list[dict]:
    """Rows in the verl/siiRL parquet layout; the reward reads the answer after the last tool call.
    ``teacher_prompts``: each row carries OPSD's privileged prompt (the question with its answer),
    as the arith task's rows do (dagrl/data/builtin_tasks.py: one signature for every task)."""
    rows = []
    for index, (a, b) in enumerate(sample_problems(split, num_rows, seed)):
        question, answer = f"{a}+{b}=", str(a + b)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "arith",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
            }
        )
        if teacher_prompts:
            privileged = f"{question}? The answer is {answer}. {question}"
            rows[-1]["teacher_prompt"] = [{"role": "user", "content": privileged}]
    return rows
