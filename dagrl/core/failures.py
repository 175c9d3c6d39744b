"""Any failure of a run, told in one line: which phase (setup, data, step N, validation, saving),
where (the DAG node and its role, the worker, the file), what was raised, and what to change.

dagrl's own errors (`DagrlError`) already say the key, the value and the fix. Everything else
(an exception in a plugin reward, a backend, a worker's setup, a data transform) becomes a
`RunFailure` at the innermost place that knows where it happened: a worker's call
(`WorkerPool.get`, from Ray's task error), a DAG node (the scheduler), or the phase the driver is
in (`phase`); dagrl's own errors keep their line, and the phase they were raised in is added to
it (`during`). Its `details` (a worker's traceback; the driver's is in the exception's chain) go to
`<trainer.default_local_dir>/dagrl.log`, which `main` writes, as for device faults
(dagrl/core/device_faults.py).
"""

from __future__ import annotations

import re
import traceback
from contextlib import contextmanager

from dagrl.core.device_faults import DeviceError, first_line
from dagrl.errors import DagrlError, WorkerDiedError

# what to change when the traceback points at no plugin of the user's
FIXES = {
    "setup": (
        "check the model directories and backend settings the config names; trainer.dry_run=true checks"
        " them again without starting workers"
    ),
    "data": "check the data files (data.train_files, data.val_files) and any row transform in external_plugins",
    "step": (
        "if the node runs code of yours (external_plugins: a reward, node kind, environment or tool), fix"
        " it there; otherwise report it with the log"
    ),
    "validation": (
        "validation runs the rollout and the rewards on data.val_files: if a reward or environment of"
        " yours raised, fix it there; trainer.test_freq=-1 and trainer.val_before_train=false skip it"
    ),
    "saving": "check that trainer.default_local_dir is writable and has room for a checkpoint",
}
FIXES["sampling"] = FIXES["step"]


class RunFailure(DagrlError):
    """An exception that is not one of dagrl's own, as one line. `phase` and `where` are filled in
    by the innermost place that knows them; `details` is a worker's traceback text (or "")."""

    def __init__(self, summary: str, details: str = "", where: str = "", phase: str = ""):
        self.summary, self.details, self.where, self.phase = summary, details, where, phase
        self.log_path: str | None = None
        super().__init__(summary)

    def __reduce__(self):
        return (RunFailure, (self.summary, self.details, self.where, self.phase))

    def __str__(self) -> str:
        phase = self.phase or "setup"
        where = f" in {self.where}" if self.where else ""
        line = f"{phase} failed{where}: {self.summary}; {self.fix()}"
        return line + (f"; full traceback in {self.log_path}" if self.log_path else "")

    def fix(self) -> str:
        culprit = plugin_frame(self.details + "".join(traceback.format_exception(self)))
        if culprit is not None:
            return f"raised in {culprit} (external_plugins): fix it there"
        return FIXES[self.phase.split()[0] if self.phase else "setup"]


def as_failure(exc: Exception, where: str = "", phase: str = "") -> DagrlError:
    """`exc` as a one-line error: dagrl's own errors unchanged, a RunFailure given the `where` and
    `phase` it lacks, anything else wrapped."""
    if isinstance(exc, RunFailure):
        exc.where, exc.phase = exc.where or where, exc.phase or phase
        return exc
    if isinstance(exc, DagrlError):
        return exc
    return RunFailure(first_line(exc), where=where, phase=phase)


def at_node(exc: Exception, node: str) -> DagrlError:
    """`exc`, raised by DAG node `node` (`reward (kind reward)`), as a one-line error naming it."""
    failure = as_failure(exc)
    if isinstance(failure, RunFailure):
        failure.where = f"DAG node {node}" + (f", {failure.where}" if failure.where else "")
    return failure


@contextmanager
def phase(name: str, where: str = "", mark_own: bool = True):
    """Errors raised inside leave as one-line errors of phase `name` (step N: `step N`).
    `mark_own=False`: dagrl's own errors pass unmarked (before a run starts, a config or data error
    is the whole story: no phase, no log file)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every exception becomes one line; the traceback is logged
        failure = as_failure(exc, where, name)
        if failure is not exc:
            raise failure from exc
        if mark_own and not isinstance(exc, (RunFailure, DeviceError, WorkerDiedError)):  # those say where
            exc.during = getattr(exc, "during", None) or name  # main adds it to dagrl's own line
        raise


def from_worker(exc: Exception, roles: str, rank: int | None) -> DagrlError:
    """A Ray task error from a call into a worker (not an engine/device fault): dagrl's own error
    raised there as it is, anything else as a RunFailure carrying the worker's traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, DagrlError) and not isinstance(cause, RunFailure):
        return cause  # already one line (a config rule a worker checks, a plugin's refusal)
    call = str(getattr(exc, "function_name", "") or "?").rsplit(".", 1)[-1]
    where = (
        f"role {roles}"
        + (f", rank {rank}" if rank is not None else "")
        + (f", call {call}" if call != "?" else "")
    )
    text = getattr(exc, "traceback_str", "") or str(exc)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    summary = first_line(cause) if isinstance(cause, BaseException) else (lines[-1] if lines else "?")
    return RunFailure(summary, details=text, where=where)


def plugin_frame(text: str) -> str | None:
    """`file:line` of the innermost frame of a traceback text that is in a loaded external plugin."""
    from dagrl.core.plugins import LOADED

    files = {getattr(m, "__file__", None) for m in LOADED.values()} - {None}
    found = None
    for file, line in re.findall(r'File "([^"]+)", line (\d+)', text):
        if file in files:
            found = f"{file}:{line}"
    return found
