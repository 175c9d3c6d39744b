"""Write docs/gpu_acceptance.md from the rows bench/acceptance_gpu.sh appended to OUT/rows.md.

    python bench/acceptance_record.py --commit HASH --date YYYY-MM-DD OUT1/rows.md OUT2/rows.md ...

HASH is the commit whose `dagrl/` ran on the card (the record is valid for a submission with the
same `dagrl/`: `git diff --stat HASH -- dagrl` prints nothing). Rows keep their order; a row
whose run is repeated keeps the last one.
"""

from __future__ import annotations

import argparse
import os

HEADER = "| run | device | rc | steps | median step s | peak GiB | plan GiB |\n| --- | --- | --- | --- | --- | --- | --- |"
NOTE = """
- steps: steps done (a run) or tests passed/total (a test group, each file in a pytest process of its own).
- peak GiB: the device in use (`torch.cuda.mem_get_info`) at the end of the rollout / of the update,
  the largest over the run's steps; plan GiB: the dry run's figure for the same two phases.
- Runs: `bench/gpu_matrix.py` (random-weight Qwen3 shapes, `rollout.name=vllm` and the defaults);
  test groups: `bench/acceptance_gpu.sh OUT tests_a|tests_b|tests_c`; two- and four-GPU rows:
  `bench/acceptance_multi_gpu.sh OUT GROUP` (the device column names the card count); rows of
  `bench/acceptance_slots.sh` (several groups at once on one host) name their cards in the device
  column, and their step seconds were taken beside the other slots.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "gpu_acceptance.md")
    )
    ap.add_argument("--notes", default="", help="a file whose text follows the table")
    ap.add_argument("rows", nargs="+")
    args = ap.parse_args()
    rows: dict[str, str] = {}
    for path in args.rows:
        for line in open(path):
            if line.startswith("| "):
                rows[line.split("|")[1].strip()] = line.rstrip("\n")
    extra = open(args.notes).read() if args.notes else ""
    with open(args.out, "w") as f:
        f.write("# GPU acceptance\n\n")
        f.write(f"commit: {args.commit}\n\ndate: {args.date}\n\n{HEADER}\n")
        f.write("\n".join(rows.values()) + "\n" + NOTE + extra)


if __name__ == "__main__":
    main()
