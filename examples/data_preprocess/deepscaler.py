"""Convert DeepScaleR (agentica-org/DeepScaleR-Preview-Dataset) to dagrl parquet.

    python3 deepscaler.py --local_dir ~/data/deepscaler
    python3 deepscaler.py --local_dir ~/data/deepscaler --local_src ./deepscaler.json

The source has a train split only; test.parquet is a holdout of --test_size rows drawn with --seed
(numpy.random.default_rng(seed)), so the same options always give the same split.
Ground truth: the `answer` field. The OPSD reference solution is `solution` (rows without one stay plain).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find `common` when loaded by file path

import common  # noqa: E402

from dagrl.errors import DataError  # noqa: E402

DATA_SOURCE = "agentica-org/DeepScaleR-Preview-Dataset"
DEFAULT_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def make_row(raw: dict, index: int, split: str, opts: common.Options) -> dict:
    problem = common.require_text(raw, "problem")
    answer = common.require_text(raw, "answer")
    solution = raw.get("solution") if isinstance(raw.get("solution"), str) else ""
    return common.build_row(
        data_source=DATA_SOURCE,
        question=problem,
        ground_truth=answer,
        solution=solution.strip() or None,
        opts=opts,
        extra_info={
            "split": split,
            "index": index,
            "question": problem,
            "answer": answer,
            "solution": solution,
        },
    )


def hold_out(source: common.SplitSource, test_size: int, seed: int) -> dict[str, common.SplitSource]:
    """Split the single train split into train and a fixed-seed test holdout (both in source order)."""
    n = len(source.indices)
    if not 0 < test_size < n:
        raise DataError(f"--test_size {test_size} must be between 1 and {n - 1} (the source has {n} rows)")
    test = set(np.random.default_rng(seed).choice(n, size=test_size, replace=False).tolist())
    return {
        "train": common.SplitSource("train", source.data, [i for i in source.indices if i not in test]),
        "test": common.SplitSource("test", source.data, sorted(test)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = common.make_parser(__doc__, DEFAULT_INSTRUCTION)
    parser.add_argument("--test_size", type=int, default=500, help="rows held out as test.parquet")
    parser.add_argument("--seed", type=int, default=0, help="seed of the test holdout")
    opts = common.parse_options(parser, argv)

    def body():
        if opts.local_src:
            sources = common.load_local(opts.local_src, ("train",), all_one_split=True)
        else:
            sources = common.load_hub(DATA_SOURCE, None, ("train",))
        sources = hold_out(sources["train"], opts.test_size, opts.seed)
        return common.convert_and_write("deepscaler", sources, make_row, opts)

    return common.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
