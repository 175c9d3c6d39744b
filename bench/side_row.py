"""One docs/gpu_acceptance.md row from a side-by-side group's output (the SIDE lines of
bench/vllm_gpu.sh side or .anchors/side_by_side.sh): the first system is the reference, every
later one is given as a ratio of its median step to the reference's.

    bash bench/vllm_gpu.sh side OUT trl default | tee LOG; python3 bench/side_row.py NAME DEVICE LOG >> OUT/rows.md

rc is 0 when every system ran to its SIDE line (the side scripts print one per finished run and a
`rc=N` line per run); steps: each system's median step, the ratios after it, and where a SIDE line
lists its steps, how far the last three stray from the median (issue 29's bar: within 10 %, no
climb); peak: the last system's device in use at its last step."""

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
    spread = last_three(ref)
    parts = [f"{label(ref)} {ref['median_step_s']} s" + (f" ({spread})" if spread else "")]
    for run in runs[1:]:
        ratio, spread = run["median_step_s"] / ref["median_step_s"], last_three(run)
        parts.append(
            f"{label(run)} {run['median_step_s']} s ({ratio:.2f}x" + (f"; {spread})" if spread else ")")
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


def last_three(run: dict) -> str:
    """The last three steps against the median, e.g. 'last 3: -9 % to +7 %'; '' where the SIDE
    line lists no steps or fewer than four."""
    steps, median = run.get("step_s") or [], run.get("median_step_s")
    if len(steps) < 4 or not median:
        return ""
    off = [100 * (s - median) / median for s in steps[-3:]]
    return f"last 3: {min(off):+.0f} % to {max(off):+.0f} %"


def label(run: dict) -> str:
    """trl, dagrl-torch, or dagrl with the overrides that set it apart (its `extra`, engine aside)."""
    extra = " ".join(
        w for w in run.get("extra", "").split() if not w.startswith("actor_rollout_ref.rollout.name=")
    )
    return run["system"] + (f" [{extra}]" if extra else "")


if __name__ == "__main__":
    name, device, path = sys.argv[1:4]
    print(side_row(name, device, open(path).read()))
