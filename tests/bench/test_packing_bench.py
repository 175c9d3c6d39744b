"""bench/packing.py's CPU smoke mode: both backends, both shapes, both passes, one JSON line each."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_bench(name: str):
    """bench/<name>.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_packing_bench_cpu_smoke(backend, tmp_path, capsys):
    argv = ["--device", "cpu", "--backend", backend, "--out", str(tmp_path)]
    if backend == "megatron":
        pytest.importorskip("megatron.core")
        # its CPU patch (tests/megatron_cpu_patch.py) changes torch.cuda for the whole process: the
        # script's own process, as a user runs it
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "bench/packing.py", *argv]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        stdout = done.stdout
    else:
        # the torch bench patches nothing: its main() here spares a fresh interpreter's imports of
        # torch, transformers and dagrl (most of this case's time on 2 cores)
        capsys.readouterr()
        load_bench("packing").main(argv)
        stdout = capsys.readouterr().out
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert [(r["shape"], r["pass"]) for r in rows] == [
        ("side", "train"),
        ("side", "logprob"),
        ("mixed", "train"),
        ("mixed", "logprob"),
    ]
    for r in rows:
        assert r["backend"] == backend and r["padded_s"] > 0 and r["packed_s"] > 0
        # the printed seconds are rounded to 4 decimals: a few ms on the CPU leave ~2% in the ratio
        assert r["ratio"] == pytest.approx(r["packed_s"] / r["padded_s"], rel=0.05)
        # the mixed lengths leave padding to remove; packing never adds any
        assert 0 <= r["packed_pad_fraction"] <= r["pad_fraction"] < 1
    assert rows[2]["packed_pad_fraction"] < rows[2]["pad_fraction"]
