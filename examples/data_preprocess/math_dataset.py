"""Convert MATH (DigitalLearningGmbH/MATH-lighteval) to dagrl parquet: train.parquet and test.parquet.

    python3 math_dataset.py --local_dir ~/data/math
    python3 math_dataset.py --local_dir ~/data/math --local_src ./MATH-lighteval/data   # train-*.parquet ...

Ground truth: the content of the last \\boxed{...} in `solution` (nested braces kept), found by the same
function the "math" reward uses on responses.
`level` and `type` are kept in extra_info. The OPSD reference solution is `solution`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find `common` when loaded by file path

import common  # noqa: E402

from dagrl.rewards.math_answer import last_boxed_content  # noqa: E402

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
SPLITS = ("train", "test")
DEFAULT_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def extract_answer(solution: str) -> str:
    """The last \\boxed{} of a MATH solution; RowError when there is none or it is empty."""
    boxed = last_boxed_content(solution)
    if boxed is None:
        raise common.RowError("no complete \\boxed{...} answer in 'solution'")
    if not boxed.strip():
        raise common.RowError("empty \\boxed{} in 'solution'")
    return boxed.strip()


def make_row(raw: dict, index: int, split: str, opts: common.Options) -> dict:
    problem = common.require_text(raw, "problem")
    solution = common.require_text(raw, "solution")
    extra_info = {
        "split": split,
        "index": index,
        "question": problem,
        "answer": solution,
        "level": str(raw.get("level") or ""),
        "type": str(raw.get("type") or ""),
    }
    return common.build_row(
        data_source=DATA_SOURCE,
        question=problem,
        ground_truth=extract_answer(solution),
        solution=solution,
        opts=opts,
        extra_info=extra_info,
    )


def main(argv: list[str] | None = None) -> int:
    opts = common.parse_options(common.make_parser(__doc__, DEFAULT_INSTRUCTION), argv)

    def body():
        if opts.local_src:
            sources = common.load_local(opts.local_src, SPLITS)
        else:
            sources = common.load_hub(DATA_SOURCE, None, SPLITS)
        return common.convert_and_write("math", sources, make_row, opts)

    return common.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
