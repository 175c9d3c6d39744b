"""Python's garbage-collector pauses in every process that starts with this folder on PYTHONPATH
and GC_TRACE_DIR set: the driver, Ray's workers (they inherit the driver's environment) and the
in-process vLLM engine inside them. A diagnostic for the rollout's step-to-step spread (is a
second of `llm.generate` the collector scanning the trainer's heap?), not part of dagrl.

Each process appends to GC_TRACE_DIR/gc_<pid>.jsonl: one line per collection of generation 2 or
of 5 ms and more (wall time, generation, ms, objects collected; for generation 2 the objects it
walked, the frozen ones not counted), and every 2 s a line with the totals per generation since
the start and each thread's CPU seconds so far (/proc/self/task: a busy thread beside the one
that runs `generate` would take the interpreter lock from it). `python bench/gc_trace_report.py
DIR` sums them up.

    GC_TRACE_DIR=$OUT/gc PYTHONPATH=$PWD/bench/gc_trace:$PYTHONPATH python -m dagrl.main ...

Python imports the first `sitecustomize` on its path at start-up, so this one hides any other
(Debian's, a venv's): use it for diagnostic runs only.
"""

import gc
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("GC_TRACE_DIR")
_LONG_MS = 5.0
_FLUSH_S = float(os.environ.get("GC_TRACE_FLUSH_S", "2"))  # seconds between totals lines


class _Trace:
    def __init__(self, path: str):
        self.path = path
        self.t0 = 0.0
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self.last_flush = time.monotonic()
        self.lines: list[str] = [json.dumps({"pid": os.getpid(), "argv": sys.argv[:3], "start": time.time()})]

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.t0 = time.perf_counter()
            return
        ms = (time.perf_counter() - self.t0) * 1e3
        gen = info.get("generation", 0)
        self.count[gen] += 1
        self.ms[gen] += ms
        if gen == 2 or ms >= _LONG_MS:
            rec = {"t": time.time(), "gen": gen, "ms": round(ms, 3), "collected": info.get("collected", 0)}
            if gen == 2:  # what a full collection walks: every tracked object but the frozen ones
                rec["walked"] = len(gc.get_objects(generation=2)) + rec["collected"]
            self.lines.append(json.dumps(rec))
        now = time.monotonic()
        if now - self.last_flush >= _FLUSH_S:
            self.flush(now)

    def flush(self, now: float) -> None:
        self.last_flush = now
        totals = {"count": self.count, "ms": [round(m, 3) for m in self.ms]}
        self.lines.append(json.dumps({"t": time.time(), "totals": totals, "threads": _threads()}))
        try:
            with open(self.path, "a") as f:
                f.write("\n".join(self.lines) + "\n")
        except OSError:
            pass
        self.lines = []


def _threads() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process so far, as "name:tid": Python's
    name for the threads it started (the OS sees "python" for each), the OS's for the others."""
    named = {t.native_id: t.name for t in threading.enumerate()}
    out, tick = {}, os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = named.get(int(tid)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}:{tid}"] = round((int(fields[11]) + int(fields[12])) / tick, 2)
    return out


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    _trace = _Trace(os.path.join(_DIR, f"gc_{os.getpid()}.jsonl"))
    gc.callbacks.append(_trace)
    import atexit

    atexit.register(lambda: _trace.flush(time.monotonic()))
