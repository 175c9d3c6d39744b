"""dagrl's built-in task "arith": two-digit addition, answered with the bare sum.

The task exists so that ``python -m dagrl.main`` can train offline on 2 CPU cores in minutes:
prompts are ~10 tokens (``<|user|>37+45=<|end|><|assistant|>``), answers at most 4 (``82<|end|>``),
and the tiny model shipped in ``dagrl/assets/tiny_arith`` (built by ``tools/build_tiny_model.py``)
starts at a low but non-zero sampled accuracy, so the GRPO reward visibly rises.

Every problem ``a+b`` with ``0 <= a, b <= 99`` belongs to exactly one split, chosen by a stable
hash of the unordered pair ``{a, b}``: test problems are never seen in training, not even as
their mirror ``b+a``.

Each row also carries a ``teacher_prompt`` that shows the answer, for on-policy self-distillation
(OPSD; only when asked for: under ``algorithm=gkd`` a row with one is distilled OPSD-style, as in
ms-swift, so the built-in task keeps it for ``algorithm=opsd``), and the answer as a reference ``response``, for distillation's off-policy steps and SFT
term (``algorithm.gkd.lmbda < 1``, ``sft_alpha > 0``); GRPO never reads either.
"""

from __future__ import annotations

import hashlib
import random
from functools import cache
from pathlib import Path

from dagrl.errors import DataError

BUILTIN_DATA_SOURCE = "dagrl/arith"
ABILITY = "arith"
SPLITS = ("train", "test")
MAX_OPERAND = 99
# One unordered pair in TEST_FRACTION_DENOM goes to test: ~1,000 test and ~9,000 train problems.
TEST_FRACTION_DENOM = 10
DEFAULT_TRAIN_ROWS = 4096
DEFAULT_TEST_ROWS = 256

_ASSETS = Path(__file__).resolve().parent.parent / "assets"
_TINY_MODEL_DIR = _ASSETS / "tiny_arith"
_TINY_TEACHER_DIR = _ASSETS / "tiny_arith_teacher"
_TINY_RM_DIR = _ASSETS / "tiny_arith_rm"


def tiny_model_path() -> str:
    """Absolute path of the tiny Qwen2-style model shipped for the arith task (HF format)."""
    return str(_TINY_MODEL_DIR)


def tiny_teacher_path() -> str:
    """Absolute path of the tiny teacher shipped for distillation on the arith task: ``tiny_arith``
    before its output distribution was flattened, trained further to read the privileged OPSD
    prompt (same tokenizer and vocabulary, HF format; tools/build_tiny_model.py)."""
    return str(_TINY_TEACHER_DIR)


def tiny_reward_model_path() -> str:
    """Absolute path of the tiny reward model shipped for the arith task: tiny_arith's backbone with
    a one-label sequence-classification head scoring correct sums above wrong ones (HF format;
    tools/build_tiny_reward_model.py). The sampling pipeline's ORM/PRM and GRPO's reward.model in tests."""
    return str(_TINY_RM_DIR)


def format_question(a: int, b: int) -> str:
    """The user-turn text of problem ``a+b``, e.g. ``"37+45="``."""
    return f"{a}+{b}="


def format_teacher_question(a: int, b: int) -> str:
    """The privileged user turn an OPSD teacher reads for ``a+b``: the answer, then the question
    again, so the response that follows is the same as after the student's prompt."""
    return f"{a}+{b}=? The answer is {a + b}. {a}+{b}="


def _split_of(a: int, b: int) -> str:
    key = f"{min(a, b)}+{max(a, b)}".encode()
    bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % TEST_FRACTION_DENOM
    return "test" if bucket == 0 else "train"


@cache
def split_problems(split: str) -> tuple[tuple[int, int], ...]:
    """All ``(a, b)`` operand pairs of ``split``, in enumeration order."""
    if split not in SPLITS:
        raise DataError(f"built-in task {BUILTIN_DATA_SOURCE}: unknown split {split!r}; use one of {SPLITS}")
    operands = range(MAX_OPERAND + 1)
    return tuple((a, b) for a in operands for b in operands if _split_of(a, b) == split)


def generate_rows(split: str, num_rows: int, seed: int, teacher_prompts: bool = True) -> list[dict]:
    """``num_rows`` distinct problems of ``split`` in the verl/siiRL parquet row layout.

    Problems are drawn without replacement in an order fixed by ``seed``, so the same arguments
    always give the same rows; `teacher_prompts=False` leaves out the privileged prompt. Raises ``DataError`` if the split has fewer than ``num_rows``
    problems (about 9,000 train, 1,000 test).
    """
    problems = split_problems(split)
    if not 0 <= num_rows <= len(problems):
        raise DataError(
            f"built-in task {BUILTIN_DATA_SOURCE}: num_rows={num_rows} for split {split!r}, "
            f"which has {len(problems)} problems; ask for at most that many"
        )
    chosen = random.Random(f"{split}:{seed}").sample(problems, num_rows)
    rows = [_make_row(split, index, a, b) for index, (a, b) in enumerate(chosen)]
    if not teacher_prompts:
        for row in rows:
            del row["teacher_prompt"]
    return rows


def _make_row(split: str, index: int, a: int, b: int) -> dict:
    question, answer = format_question(a, b), str(a + b)
    return {
        "data_source": BUILTIN_DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
        "teacher_prompt": [{"role": "user", "content": format_teacher_question(a, b)}],
        "response": answer,
    }
