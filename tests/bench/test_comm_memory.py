"""bench/comm_memory.py on the CPU (gloo, two processes): every point is read on both ranks, and
megatron's groups of a two-stage pipeline are found and used (the GPU run reads their device bytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "comm_memory.py")


def comm_lines(*args: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, SCRIPT, "--backend", "gloo", *args], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line[5:]) for line in out.stdout.splitlines() if line.startswith("COMM ")]


def test_a_pipeline_of_two_reads_every_point_and_megatron_s_groups():
    (line,) = comm_lines("--megatron", "pp", "--modes", "lazy")
    assert line["mode"] == "lazy" and set(line["ranks"]) == {"0", "1"}
    for points in line["ranks"].values():
        points_in_order = ["context", "world", "group_1", "group_2", "group_3", "p2p", "singleton"]
        assert list(points)[:8] == [*points_in_order, "megatron_init"]
        groups = {k for k in points if k.startswith("megatron:")}
        # the groups a two-stage step talks over: the stages' own, the tied embedding's, the grad norm's
        assert {"megatron:pipeline_model_parallel_group", "megatron:embedding_group"} <= groups
        assert "megatron:model_parallel_group" in groups
        assert "megatron:tensor_model_parallel_group" not in groups  # one rank each: no communicator


def test_an_unknown_mode_is_refused():
    out = subprocess.run(
        [sys.executable, SCRIPT, "--backend", "gloo", "--megatron", "none", "--modes", "eager"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "--modes: eager is not one of" in out.stderr


def test_a_mode_that_fails_reports_what_it_read_and_the_run_fails(monkeypatch, capsys):
    """A mode whose processes fail (here: a fake spawn that records two points, then raises) prints
    the points read before the failure and the error; the next mode still runs; the exit code is 1."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import comm_memory

    def spawn(fn, args, nprocs):
        world, _, _, mode, out = args
        out[0] = {"context": 0.5, "world": 0.25}
        if mode == "lazy":
            raise RuntimeError("process 1 terminated with exit code 1\nncclUnhandledCudaError: out of memory")
        out[0] = {**out[0], "group_1": 0.25}

    monkeypatch.setattr(comm_memory.mp, "spawn", spawn)
    monkeypatch.setattr(sys, "argv", ["comm_memory.py", "--backend", "gloo", "--modes", "lazy,split"])
    assert comm_memory.main() == 1
    lines = [json.loads(ln[5:]) for ln in capsys.readouterr().out.splitlines() if ln.startswith("COMM ")]
    assert [(ln["mode"], ln["error"]) for ln in lines] == [
        ("lazy", "RuntimeError: ncclUnhandledCudaError: out of memory"),
        ("split", None),
    ]
    assert lines[0]["ranks"] == {"0": {"context": 0.5, "world": 0.25}}
    assert lines[1]["communicators_gib"] == {"0": 0.5}
