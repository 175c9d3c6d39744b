"""What the megatron backend's rules ask of the installation, without importing it.

Callers look the probe up on this module when they run (`probes.transformer_engine_available()`),
so a test can answer for a machine it is not (TransformerEngine present or not)."""

from __future__ import annotations

import importlib.util


def transformer_engine_available() -> bool:
    """Whether TransformerEngine is installed (looked up, not imported: importing it needs CUDA)."""
    return importlib.util.find_spec("transformer_engine") is not None
