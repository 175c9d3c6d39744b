"""tests/gpu_runs.py's helpers, which the GPU tests lean on to run beside each other on one host."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.gpu_runs import kill_session, visible_cards


def test_kill_session_ends_members_in_groups_of_their_own():
    """A Ray worker sits in a process group of its own inside its driver's session: killing the
    driver's group would miss it."""
    child = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60'], process_group=0);"
        " print(p.pid, flush=True); time.sleep(60)"
    )
    shell = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    job = int(shell.stdout.readline())
    assert os.getpgid(job) != shell.pid and os.getsid(job) == shell.pid
    kill_session(shell.pid)
    shell.wait(timeout=10)
    for _ in range(100):
        try:
            os.kill(job, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{job}/stat") as f:  # killed, waiting for its parent to reap it
            if f.read().split(") ")[1].startswith("Z"):
                return
        time.sleep(0.05)
    raise AssertionError(f"process {job} of session {shell.pid} outlived kill_session")


def test_visible_cards_reads_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert visible_cards() == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_cards() == []


def test_documented_cards_map_onto_the_cards_this_process_was_given(monkeypatch):
    """`CUDA_VISIBLE_DEVICES=0,1 python -m dagrl.main ...` in a document: run beside other tests,
    the command gets the first two cards of this process, not physical cards 0 and 1."""
    import pytest

    from tests.e2e import test_documented_gpu as documented

    monkeypatch.setattr(
        documented, "documented_env", lambda command: {"CUDA_VISIBLE_DEVICES": "0,1", "X": "y"}
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    env, cards = documented.command_env("python -m dagrl.main")
    assert (env["CUDA_VISIBLE_DEVICES"], cards, env["X"]) == ("4,6", 2, "y")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with pytest.raises(pytest.skip.Exception, match="this process has 1 card"):
        documented.command_env("python -m dagrl.main")
    monkeypatch.setattr(documented, "documented_env", lambda command: {})
    assert documented.command_env("python -m dagrl.main")[0]["CUDA_VISIBLE_DEVICES"] == "5"


def test_documented_env_keeps_what_the_command_is_written_after():
    from tests.docs.commands import ROOT, commands_in, documented_env

    shown = "```\nFOO=1 CUDA_VISIBLE_DEVICES=0,1 python -m dagrl.main a=b \\\n  c=d\n```\n"
    assert commands_in(shown) == ["python -m dagrl.main a=b c=d"]
    run_sh = next(
        c
        for c in commands_in((ROOT / "README.md").read_text())
        if c.startswith("bash run_scripts/gkd/run.sh")
    )
    assert documented_env(run_sh)["CUDA_VISIBLE_DEVICES"] == "0,1"
