"""Errors shown to users. Each names what is wrong (config key, file, row) and how to fix it."""

from __future__ import annotations


class DagrlError(Exception):
    """Base class of every error dagrl raises for bad user input."""


class ConfigError(DagrlError):
    """A config value is wrong: names the dotted key, the value, and the fix."""

    def __init__(self, key: str, value: object, fix: str):
        self.key, self.value, self.fix = key, value, fix
        super().__init__(f"config key '{key}' = {value!r}: {fix}")

    def __reduce__(self):  # raised in a worker, it crosses Ray by pickle
        return (ConfigError, (self.key, self.value, self.fix))


class DataError(DagrlError):
    """A data file or row is wrong: the message names the file and row."""


class DagError(DagrlError):
    """The DAG declared in conf/dags/*.yaml is invalid."""


class PlacementError(DagrlError):
    """Roles, GPUs and the declared cluster do not fit together."""


class CheckpointError(DagrlError):
    """A checkpoint could not be written, or none that resume may use is intact."""


class NonFiniteError(DagrlError):
    """More steps in a row than trainer.max_consecutive_skipped_steps skipped their update for a
    non-finite loss, gradient or reward."""


class WorkerDiedError(DagrlError):
    """A Ray worker process died: the message names its role, rank, node and last error."""


class Interrupted(DagrlError):
    """The run was stopped by SIGINT / SIGTERM; exit_code follows the shell's 128 + signal."""

    def __init__(self, message: str, exit_code: int):
        self.exit_code = exit_code
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.exit_code))
