"""Import user modules named in `external_plugins`; their decorators register node kinds and rewards."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from dagrl.errors import ConfigError

LOADED: dict[str, object] = {}  # entry -> module, in load order (rewards are looked up in them by name)


def absolute_plugin_paths(modules: list[str]) -> list[str]:
    """The entries with each .py path made absolute: the workers import them too, and their working
    directory is not the driver's (a joined cluster, a session's Ray started elsewhere)."""
    return [os.path.abspath(os.path.expanduser(m)) if m.endswith(".py") else m for m in modules]


def load_plugins(modules: list[str]) -> None:
    """Each entry is a module name (`my_pkg.rewards`) or a path to a .py file."""
    for i, entry in enumerate(modules):
        key = f"external_plugins[{i}]"
        try:
            if entry.endswith(".py"):
                path = os.path.abspath(os.path.expanduser(entry))
                if not os.path.isfile(path):
                    raise ConfigError(key, entry, "no such file; give a module name or an existing .py path")
                name = "dagrl_plugin_" + os.path.splitext(os.path.basename(path))[0]
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
            else:
                module = importlib.import_module(entry)
            LOADED[entry] = module
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                key, entry, f"importing it failed: {exc!r}; make it importable (PYTHONPATH)"
            ) from exc
