"""What bench/gc_trace/sitecustomize.py saw: per process, the collections and their total pause
per generation, the longest generation-2 pause, when each generation-2 pause came (seconds
after the process started: start-up, or the steady state of the steps) and how many objects it
walked, and the threads that used the most CPU time between the first and the last 2-second line
(a thread busy beside the main one while vLLM generates competes for the interpreter lock).

    python bench/gc_trace_report.py DIR      (DIR = the run's GC_TRACE_DIR)
"""

from __future__ import annotations

import glob
import json
import os
import sys


def read(path: str) -> dict:
    head, totals, long, threads = {}, None, [], []
    for line in open(path):
        if not line.strip():
            continue
        rec = json.loads(line)
        if "pid" in rec:
            head = rec
        elif "totals" in rec:
            totals = rec["totals"]
            threads.append(rec.get("threads", {}))
        else:
            long.append(rec)
    return {"head": head, "totals": totals, "long": long, "threads": threads}


def busiest(samples: list[dict], top: int = 6) -> list[list]:
    """The threads with the most CPU seconds between the first and the last sample: [name, s]."""
    if len(samples) < 2:
        return []
    first, last = samples[0], samples[-1]
    used = {name: s - first.get(name, 0.0) for name, s in last.items()}
    return [[n, round(s, 2)] for n, s in sorted(used.items(), key=lambda kv: -kv[1])[:top] if s > 0]


def summary(trace: dict) -> dict:
    totals = trace["totals"] or {"count": [0, 0, 0], "ms": [0.0, 0.0, 0.0]}
    long = trace["long"]
    start = trace["head"].get("start", 0.0)
    return {
        "pid": trace["head"].get("pid"),
        "argv": " ".join(trace["head"].get("argv", []))[:80],
        "count": totals["count"],
        "ms": totals["ms"],
        "gen2_max_ms": max((r["ms"] for r in long if r["gen"] == 2), default=0.0),
        # each generation-2 pause: seconds since the process started, ms (start-up or steady state?)
        "gen2": [[round(r["t"] - start, 1), round(r["ms"]), r.get("walked")] for r in long if r["gen"] == 2],
        "long_pauses": len(long),
        "long_ms": round(sum(r["ms"] for r in long), 1),
        "busiest_threads": busiest(trace.get("threads", [])),
    }


def main(folder: str) -> None:
    rows = [summary(read(p)) for p in sorted(glob.glob(os.path.join(folder, "gc_*.jsonl")))]
    rows.sort(key=lambda r: -sum(r["ms"]))
    for r in rows:
        print("GC", json.dumps(r))
    if rows:
        top = rows[0]
        print(
            f"most GC time: pid {top['pid']} ({top['argv']}), {sum(top['ms']):.0f} ms in "
            f"{sum(top['count'])} collections, longest gen-2 pause {top['gen2_max_ms']:.0f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1])
