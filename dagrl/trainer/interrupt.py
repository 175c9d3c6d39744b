"""Ctrl-C and SIGTERM on the driver: finish the current step, write a final checkpoint, exit.

The first signal only sets a flag; the step loop looks at it between steps (the safe point:
no worker is mid-update, every pool is idle) and saves a checkpoint unless the step already has
one. A second signal means "now": Ray is shut down (so no worker or Ray daemon is orphaned) and
the process exits at once, without a checkpoint. Exit codes follow the shell: 128 + signal
(130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from dagrl.errors import Interrupted
from dagrl.trainer.logger import log

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested: int | None = None


@contextlib.contextmanager
def stop_signals():
    """Handle SIGINT/SIGTERM as above while the block runs; the previous handlers come back after."""
    global _requested
    _requested = None
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    install()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def install() -> None:
    """(Re)install the handlers: ray.init replaces the SIGTERM handler with its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in _SIGNALS:
        signal.signal(s, _handle)


def stop_if_requested(trainer) -> None:
    """At a safe point between steps: if a stop was asked for, save (unless this step is saved)
    and raise Interrupted with the exit code."""
    if _requested is None:
        return
    name = signal.Signals(_requested).name
    if trainer.step > trainer.saved_step:
        done = f"final checkpoint {trainer.save()}"
    elif trainer.step > 0:
        done = f"its checkpoint (step {trainer.saved_step}) was already written"
    else:
        done = "nothing trained yet, no checkpoint"
    raise Interrupted(
        f"stopped by {name} after step {trainer.step}; {done}; run the same command to resume",
        128 + _requested,
    )


def _handle(signum: int, frame) -> None:
    global _requested
    name = signal.Signals(signum).name
    if _requested is None:
        _requested = signum
        log(
            f"{name} received: stopping after the current step with a final checkpoint"
            " (send it again to stop at once, without one)"
        )
        return
    log(f"second {name}: stopping now, without a final checkpoint")
    _exit_now(128 + signum)


def _exit_now(code: int) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()  # stops the local Ray (workers, raylet, agents): os._exit alone orphans them
    os._exit(code)
