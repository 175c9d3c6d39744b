"""The one place the driver prints (rank-0 style); every layer may use it."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    """Print one line to stdout, flushed."""
    print(msg, file=sys.stdout, flush=True)
