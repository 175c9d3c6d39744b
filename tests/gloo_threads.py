"""Members of a gloo process group on threads of the test process: gloo runs its collectives on
threads of its own, and a process per member would cost ~15 s of imports on CI while checking
nothing more (tests/backends/test_weight_*.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def on_threads(world_size: int, member: Callable[[int], None], timeout_s: float = 30.0) -> None:
    """member(rank) for every rank at once; the first error of any member is raised here."""
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            member(rank)
        except Exception as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    if errors:  # before the hang check: a member that failed leaves the others waiting on it
        raise errors[0]
    assert not any(t.is_alive() for t in threads), f"a member still runs after {timeout_s} s"
