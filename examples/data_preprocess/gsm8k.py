"""Convert GSM8K (openai/gsm8k, config "main") to dagrl parquet: train.parquet and test.parquet.

    python3 gsm8k.py --local_dir ~/data/gsm8k                       # download with `datasets`
    python3 gsm8k.py --local_dir ~/data/gsm8k --local_src ./gsm8k   # train.jsonl/test.jsonl or the hub parquet

Ground truth: the text after "####" in `answer`, commas removed ("1,200" -> "1200").
The OPSD reference solution is `answer` without the <<48/2=24>> calculator annotations.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find `common` when loaded by file path

import common  # noqa: E402

DATA_SOURCE = "openai/gsm8k"
SPLITS = ("train", "test")
DEFAULT_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def extract_answer(answer: str) -> str:
    """The final answer after "####", commas stripped; RowError when there is none."""
    if "####" not in answer:
        raise common.RowError("no '####' final answer in 'answer'")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise common.RowError("nothing after '####' in 'answer'")
    return final


def make_row(raw: dict, index: int, split: str, opts: common.Options) -> dict:
    question = common.require_text(raw, "question")
    answer = common.require_text(raw, "answer")
    return common.build_row(
        data_source=DATA_SOURCE,
        question=question,
        ground_truth=extract_answer(answer),
        solution=re.sub(r"<<[^>]*>>", "", answer),
        opts=opts,
        extra_info={"split": split, "index": index, "question": question, "answer": answer},
    )


def main(argv: list[str] | None = None) -> int:
    opts = common.parse_options(common.make_parser(__doc__, DEFAULT_INSTRUCTION), argv)

    def body():
        if opts.local_src:
            sources = common.load_local(opts.local_src, SPLITS)
        else:
            sources = common.load_hub(DATA_SOURCE, "main", SPLITS)
        return common.convert_and_write("gsm8k", sources, make_row, opts)

    return common.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
