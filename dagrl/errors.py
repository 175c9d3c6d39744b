"""Errors shown to users. Each names what is wrong (config key, file, row) and how to fix it."""

from __future__ import annotations


class DagrlError(Exception):
    """Base class of every error dagrl raises for bad user input."""


class ConfigError(DagrlError):
    """A config value is wrong: names the dotted key, the value, and the fix."""

    def __init__(self, key: str, value: object, fix: str):
        self.key, self.value, self.fix = key, value, fix
        super().__init__(f"config key '{key}' = {value!r}: {fix}")


class DataError(DagrlError):
    """A data file or row is wrong: the message names the file and row."""


class DagError(DagrlError):
    """The DAG declared in conf/dags/*.yaml is invalid."""


class PlacementError(DagrlError):
    """Roles, GPUs and the declared cluster do not fit together."""
