"""Importing this module registers the built-in tools, environments and parsers."""

from dagrl.tools import calculator, environment, parsers, sandbox  # noqa: F401
