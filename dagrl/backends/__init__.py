"""Backends and their registry: a role's backend is found under (role kind, name)."""

from dagrl.backends import builtin  # noqa: F401  (registers the built-in backends)
from dagrl.backends.registry import (
    backend_names,
    build_backend,
    check_backends,
    register_backend,
)

__all__ = ["backend_names", "build_backend", "check_backends", "register_backend"]
