"""The python tool: output, limits, no network."""

from __future__ import annotations

from dagrl.tools.sandbox import run_python


def test_prints_output_and_reports_errors():
    assert run_python("print(sum(range(10)))") == "45"
    assert run_python("1/0").startswith("Error: ZeroDivisionError")
    assert run_python("x = 1") == "(no output; print the result)"


def test_limits_stop_runaway_code():
    assert "ran past 1 s" in run_python("import time; time.sleep(10)", timeout_s=1)
    assert "CPU" in run_python("while True: pass", timeout_s=5, cpu_s=1)
    assert run_python("x = bytearray(2 << 30)", memory_mb=256) == "Error: MemoryError"


def test_no_network():
    out = run_python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1); print('open')")
    assert out.startswith("Error:") and "open" not in out
