"""A train backend's part in the plan's automatic choices and advice (dagrl/trainer/capacity.py).

The plan resolves what the config leaves to `auto` (recomputation, the optimizer's place, offload
between phases) by trying each choice against the card. What a choice means, and which key holds
it, is the backend's: it registers these hooks with itself (`register_backend(..., plan_hooks=)`),
and the plan asks the train role's backend for them instead of naming backends. A train backend
without hooks gets no automatic choice (its keys stay as the user set them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _never(cfg: Any) -> bool:
    return False


def _nothing(cfg: Any) -> None:
    return None


@dataclass(frozen=True)
class PlanHooks:
    """- `optimizer_host(cfg) -> (section, key)`: the config section whose `optimizer_cpu_offload`
      places this backend's optimizer state, and that key's full name (auto = None there).
    - `resident_between_phases`: the backend keeps its state on the device between phases unless
      its own offload keys say otherwise, so the optimizer stays on the device only when every
      phase also fits within the plan's resident share of the card.
    - `recompute_pinned(cfg)`: the backend's own recomputation keys are set; auto leaves them.
    - `enable_recompute(cfg)`: what `model.gradient_checkpointing=true` turns on in its own keys.
    - `names_recompute_key`: a phase over the card with `model.gradient_checkpointing` pinned off
      is refused under that key (recomputation is the way out).
    - `auto_offload`: `actor.offload=auto` decides its train and ref roles' offload between phases.
    - `update_levers(spec) -> (recompute lever, optimizer lever)`: the update's keys to pull, each
      None when the spec already pulls it; None = the generic `model.gradient_checkpointing` and
      `actor.optimizer_cpu_offload`."""

    optimizer_host: Callable[[Any], tuple[Any, str]]
    resident_between_phases: bool = False
    recompute_pinned: Callable[[Any], bool] = _never
    enable_recompute: Callable[[Any], None] = _nothing
    names_recompute_key: bool = False
    auto_offload: bool = False
    update_levers: Callable[[Any], tuple[str | None, str | None]] | None = None
