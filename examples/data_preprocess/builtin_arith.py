"""Export dagrl's built-in task "arith" (two-digit addition) to parquet: train.parquet and test.parquet.

    python3 builtin_arith.py --local_dir ~/data/arith

Training on the built-in task does not need these files (leaving data.train_files unset picks it); export
them to look at the rows, or to train on them like any other parquet dataset. Test problems never occur
in train.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find `common` when loaded by file path

import common  # noqa: E402

from dagrl.data.builtin import DEFAULT_TEST_ROWS, DEFAULT_TRAIN_ROWS, generate_rows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--local_dir", required=True, help="output dir: writes train.parquet, test.parquet")
    parser.add_argument("--train_size", type=int, default=DEFAULT_TRAIN_ROWS, help="rows in train.parquet")
    parser.add_argument("--test_size", type=int, default=DEFAULT_TEST_ROWS, help="rows in test.parquet")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row order")
    args = parser.parse_args(argv)

    def body():
        sizes = {"train": args.train_size, "test": args.test_size}
        rows = {split: generate_rows(split, size, args.seed) for split, size in sizes.items()}
        reports = [common.SplitReport(split, rows_in=len(r), rows_out=len(r)) for split, r in rows.items()]
        common.write_splits("arith", rows, reports, args.local_dir)  # --test_size 0: no test.parquet
        return reports

    return common.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
