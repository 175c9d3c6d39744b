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
