"""One docs/gpu_acceptance.md row from a side-by-side group's output (the SIDE lines of
bench/vllm_gpu.sh side or .anchors/side_by_side.sh): the first system is the reference, every
later one is given as a ratio of its median step to the reference's.

    bash bench/vllm_gpu.sh side OUT trl default | tee LOG; python3 bench/side_row.py NAME DEVICE LOG >> OUT/rows.md

rc is 0 when every system ran to its SIDE line (the side scripts print one per finished run and a
`rc=N` line per run); steps: each system's median step, the ratios after it; peak: the last
system's device in use at its last step."""

from __future__ import annotations

import json
import re
import sys


def side_row(name: str, device: str, text: str) -> str:
    runs = [parse(line[5:]) for line in text.splitlines() if line.startswith("SIDE {")]
    failed = [int(c) for c in re.findall(r"\brc=(-?\d+)", text) if int(c) != 0]
    if len(runs) < 2:
        return f"| {name} | {device} | {failed[0] if failed else 1} | {len(runs)} of 2 runs wrote a SIDE line | | | |"
    ref = runs[0]
    parts = [f"{label(ref)} {ref['median_step_s']} s"]
    for run in runs[1:]:
        parts.append(
            f"{label(run)} {run['median_step_s']} s ({run['median_step_s'] / ref['median_step_s']:.2f}x)"
        )
    last = runs[-1]
    peak = (last.get("last") or {}).get("perf/device_memory_used_gib", last.get("peak_GiB"))
    peak = "" if peak is None else f"{float(peak):.2f}"
    rc = failed[0] if failed else 0
    return f"| {name} | {device} | {rc} | {'; '.join(parts)} | {last['median_step_s']} | {peak} | |"


def parse(text: str) -> dict:
    """A SIDE line's JSON; one cut short (a log shows its first 600 characters) keeps the fields
    that come first: system, extra, median_step_s."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        fields = dict(re.findall(r'"(system|extra)": "([^"]*)"', text))
        median = re.search(r'"median_step_s": ([0-9.]+)', text)
        return {**fields, "median_step_s": float(median.group(1)) if median else float("nan")}


def label(run: dict) -> str:
    """trl, dagrl-torch, or dagrl with the overrides that set it apart (its `extra`, engine aside)."""
    extra = " ".join(
        w for w in run.get("extra", "").split() if not w.startswith("actor_rollout_ref.rollout.name=")
    )
    return run["system"] + (f" [{extra}]" if extra else "")


if __name__ == "__main__":
    name, device, path = sys.argv[1:4]
    print(side_row(name, device, open(path).read()))
