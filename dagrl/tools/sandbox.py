"""`python`: run a Python snippet in a subprocess with CPU, memory, file-size and wall-clock
limits and no network; the observation is its stdout (and the tail of stderr on failure).

What isolates it, honestly:
- Limits: RLIMIT_CPU (cpu_s), RLIMIT_AS (memory_mb), RLIMIT_FSIZE (files written), RLIMIT_NPROC
  is not set (it counts the whole user's processes); a wall-clock timeout kills the process group.
- Network: the child enters new user + network namespaces (unshare(2), no privileges needed where
  unprivileged user namespaces are enabled): it sees only a down loopback. Where unshare fails
  (containers that forbid it) the child still runs, with a Python audit hook that refuses every
  socket operation: that stops Python code, not C extensions or subprocesses, so it is a guard,
  not a security boundary. `network_isolation` in the tool's result info says which one ran.
- Files: a fresh temporary working directory, `python -I` (no user site, no PYTHON* variables),
  an empty environment. The file system is otherwise the host's, read and write as the user:
  this sandbox is for a policy's arithmetic and data wrangling, not for hostile code.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile

from dagrl.tools.base import Tool, register_tool

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
# Runs before the snippet: refuse sockets from Python even where namespaces are unavailable.
_PRELUDE = """
import sys
def _no_network(event, args):
    if event.startswith("socket."):
        raise PermissionError("network access is disabled in the python tool")
sys.addaudithook(_no_network)
del _no_network
exec(compile(open(sys.argv[1]).read(), "<tool>", "exec"), {"__name__": "__main__"})
"""


def _limits(cpu_s: int, memory_mb: int, file_mb: int):
    libc = ctypes.CDLL(None, use_errno=True)

    def apply() -> None:  # in the child, between fork and exec
        os.setsid()  # its own process group: a timeout kills what it spawned too
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)  # best effort; the audit hook stays either way

    return apply


def network_namespace_available() -> bool:
    """Whether this host lets an unprivileged child enter a new network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:  # the check itself, in a throwaway child
        os._exit(0 if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0 else 1)
    return os.waitpid(pid, 0)[1] == 0


def run_python(
    code: str, timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 1024, max_output_chars: int = 4000
) -> str:
    """Run `code`; its stdout, or an error text naming the limit it hit."""
    with tempfile.TemporaryDirectory(prefix="dagrl-python-") as work:
        script = os.path.join(work, "snippet.py")
        with open(script, "w") as f:
            f.write(code)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _PRELUDE, script],
            cwd=work,
            env={},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_limits(cpu_s, memory_mb, 16),
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"Error: the code ran past {timeout_s:g} s and was stopped"
    if proc.returncode == -signal.SIGXCPU or proc.returncode == -signal.SIGKILL:
        return f"Error: the code used more than {cpu_s} s of CPU and was stopped"
    if proc.returncode != 0:
        lines = err.strip().splitlines()
        return "Error: " + (lines[-1] if lines else f"exit status {proc.returncode}")
    return out[:max_output_chars].rstrip("\n") or "(no output; print the result)"


@register_tool("python")
def python_tool(timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 1024) -> Tool:
    """Config keys: timeout_s (wall clock), cpu_s, memory_mb (address space)."""

    def run(code: str) -> str:
        return run_python(code, timeout_s, cpu_s, memory_mb)

    return Tool(
        "python",
        run,
        "Run Python 3 code and return what it prints. No network; limited CPU time and memory.",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print() the result"}},
            "required": ["code"],
        },
    )
