"""bench/gc_trace: the collector's pauses of a process started with the folder on PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.gc_trace_report import read, summary

TRACE = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gc_trace")
CHILD = "import gc\nfor _ in range(3):\n    gc.collect(2)\nprint('done')\n"


SPINNER = """import gc, threading, time
def spin():
    while True:
        sum(range(1000))
threading.Thread(target=spin, name="spinner", daemon=True).start()
end = time.monotonic() + 1.0
while time.monotonic() < end:
    gc.collect(0)
    time.sleep(0.01)
print('done')
"""


def run_child(env_extra: dict, cwd, code: str = CHILD) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(TRACE), **env_extra}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_a_traced_process_writes_its_full_collections(tmp_path):
    out = tmp_path / "gc"
    proc = run_child({"GC_TRACE_DIR": str(out)}, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    (path,) = list(out.glob("gc_*.jsonl"))
    rows = summary(read(str(path)))
    assert rows["pid"] == int(path.stem.split("_")[1])
    assert rows["count"][2] >= 3 and len(rows["gen2"]) >= 3  # the three explicit full collections
    assert all(ms >= 0 and walked > 0 for _, ms, walked in rows["gen2"])
    assert json.loads(path.read_text().splitlines()[0])["argv"] == ["-c"]


def test_without_the_directory_nothing_is_written(tmp_path):
    # an empty GC_TRACE_DIR traces nothing: no file in the child's working directory either
    proc = run_child({"GC_TRACE_DIR": ""}, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_busy_thread_beside_the_main_one_is_named_with_its_cpu_seconds(tmp_path):
    out = tmp_path / "gc"
    proc = run_child({"GC_TRACE_DIR": str(out), "GC_TRACE_FLUSH_S": "0.1"}, tmp_path, SPINNER)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    (path,) = list(out.glob("gc_*.jsonl"))
    busiest = summary(read(str(path)))["busiest_threads"]
    names = [name.split(":")[0] for name, _ in busiest]
    assert "spinner" in names, busiest
    spun = dict((name.split(":")[0], s) for name, s in busiest)["spinner"]
    assert 0.2 <= spun <= 1.5  # it ran for about the child's second, sharing the lock with main
