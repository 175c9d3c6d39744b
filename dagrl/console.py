"""The one place the driver prints (rank-0 style); every layer may use it."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    """Print one line to stdout, flushed."""
    print(msg, file=sys.stdout, flush=True)


_said: set[str] = set()


def log_once(msg: str) -> None:
    """`log`, once per process: for notes from rules that run more than once (validation passes)."""
    if msg not in _said:
        _said.add(msg)
        log(msg)
