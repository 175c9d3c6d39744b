"""Backends and their registry: a role's backend is found under (role kind, name)."""

from dagrl.backends.registry import backend_names, build_backend, check_backends, register_backend

__all__ = ["backend_names", "build_backend", "check_backends", "register_backend"]
