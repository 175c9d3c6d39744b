"""What GPU tests need to run beside each other on one host, each test file on a card of its own
(CUDA_VISIBLE_DEVICES=i, its own TMPDIR and working directory): the cards this process was given,
a free port, and `python -m dagrl.main` in a process session of its own.

A run's Ray (its GCS and raylet in the driver's process group, each worker in a group of its own)
is started by the run's driver and stays in the driver's session, so killing that session ends the
run and nothing else; `ray stop` would stop every Ray on the host, a test's on the next card
included.

Device time is the scarce thing here: a vLLM engine a test does not time starts eager
(`actor_rollout_ref.rollout.enforce_eager=true`, `+teacher.engine_kwargs.enforce_eager=true`,
`+reward.model.engine_kwargs.enforce_eager=true`), seconds where torch.compile and CUDA-graph
capture take 60-100 s even on the shipped tiny model. The compiled engine, the product's default,
runs in tests/backends/vllm/test_vllm_gpu.py (sleep, staged wake, in-place refresh),
tests/trainer/test_handover_gpu.py and tests/e2e/test_documented_gpu.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def visible_cards() -> list[str]:
    """The cards this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs); every
    card of the machine when it is unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    return [card.strip() for card in value.split(",") if card.strip()]


def free_port() -> int:
    """A TCP port nobody listens on now: a fixed one would meet the same test running on the next
    card."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment for a `python -m dagrl.main` child: the checkout first on
    PYTHONPATH (the site directories after it kept), Ray's usage report and auth off."""
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", **extra)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a child started with start_new_session=True)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getsid(int(entry)) == sid:
                    os.kill(int(entry), signal.SIGKILL)


def run_cli(args: list[str], *, cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`python -m dagrl.main args...` in a session of its own, killed whole once the driver exits
    or runs out of time (then subprocess.TimeoutExpired, with what it printed). Output goes to files,
    not pipes: a Ray process that outlives the driver cannot keep the reader waiting."""
    cmd = [sys.executable, "-m", "dagrl.main", *args]
    with (
        tempfile.TemporaryFile("w+", errors="replace") as out,
        tempfile.TemporaryFile("w+", errors="replace") as err,
    ):
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
        code = None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_session(proc.pid)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code is None:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def failure(proc: subprocess.CompletedProcess, tail: int = 2000) -> str:
    """What a failed CLI run said: dagrl's one-line `error:` (printed before Ray's workers flush
    their warnings, so a plain tail of the output can miss it), then the output's tail."""
    text = proc.stdout + proc.stderr
    errors = [line for line in text.splitlines() if line.lstrip().startswith("error:")]
    return "\n".join(errors) + "\n...\n" + text[-tail:]
