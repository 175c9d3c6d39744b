"""The run's log file, `<trainer.default_local_dir>/dagrl.log`: what a one-line console error
leaves out (a worker's full traceback) is appended here, with the time and that line."""

from __future__ import annotations

import os
import time
import traceback

LOG_NAME = "dagrl.log"


def write_failure(out_dir: str, error: BaseException) -> str | None:
    """Append `error`'s line, the worker's traceback it carries (`details`) and the driver's own
    traceback to the run's log; its path, or None when the directory cannot be written."""
    path = os.path.join(os.path.abspath(os.path.expanduser(out_dir)), LOG_NAME)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    driver = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    text = (
        f"=== {stamp} error: {error}\n"
        f"--- traceback in the worker:\n{getattr(error, 'details', '') or '(none)'}\n"
        f"--- traceback on the driver:\n{driver}\n"
    )
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(text)
    except OSError:
        return None
    return path
