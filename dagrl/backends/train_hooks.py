"""A train backend's part in decoding its roles' specs (dagrl/config/roles.py) and in the plan's
automatic choices and advice (dagrl/trainer/capacity.py).

The specs of the train, ref and colocated teacher roles carry the backend's own config section
(found by the class it registered, `Backend.config_type`), layout and offload policy, and the
rollout samples in the backend's compute dtype: the backend says what those are (`layout`,
`offload`, `compute_dtype`), so the role table names no backend.

The plan resolves what the config leaves to `auto` (recomputation, the optimizer's place, offload
between phases) by trying each choice against the card. What a choice means, and which key holds
it, is the backend's: it registers these hooks with itself (`register_backend(..., hooks=)`),
and the plan asks the train role's backend for them instead of naming backends. A train backend
without hooks gets no automatic choice (its keys stay as the user set them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _never(cfg: Any) -> bool:
    return False


def _nothing(cfg: Any) -> None:
    return None


@dataclass(frozen=True)
class TrainHooks:
    """- `optimizer_host(cfg) -> (section, key)`: the config section whose `optimizer_cpu_offload`
      places this backend's optimizer state, and that key's full name (auto = None there).
    - `optimizer_host_blocked(cfg) -> (full key, value) | None`: the setting that keeps this
      backend's optimizer off the host (the plan's auto then leaves it on the device, and names
      that key where the update does not fit); None = nothing does.
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
      `actor.optimizer_cpu_offload`.
    - `layout(section) -> ParallelLayout`: the model-parallel layout it gives; None = data parallel.
    - `offload(cfg, section) -> OffloadPolicy`: what its train and ref roles move to the host between
      turns; None = the generic `actor.offload` (params and optimizer state together).
    - `compute_dtype(cfg) -> str | None`: the dtype it computes in when the rollout's is not set
      (the engine samples in it); None = the model's dtype.
    - `lora_reference_is_base`: a LoRA actor's colocated reference is its base with the adapter off
      (no second copy of the model).
    - `optimizer_share(cfg) -> (section, full key)`: where the CPU optimizer's share of the
      parameters is set, null = auto (the plan picks it to fit the host); None = all or nothing.
    - `applies_lora`: it trains a LoRA adapter (actor_rollout_ref.model.lora_rank > 0); a backend
      without would train every weight, so LoRA is refused on it.
    - `device_levers` / `host_levers` / `idle_levers`: its keys that lower a phase's device memory /
      the host state it plans / what its roles keep while idle, as the plan's advice names them
      (text, joined with the other backends').
    - `swift_offload`: ms-swift's `offload_model` / `offload_optimizer` as its own full keys."""

    optimizer_host: Callable[[Any], tuple[Any, str]]
    optimizer_host_blocked: Callable[[Any], tuple[str, Any] | None] = _nothing
    resident_between_phases: bool = False
    recompute_pinned: Callable[[Any], bool] = _never
    enable_recompute: Callable[[Any], None] = _nothing
    names_recompute_key: bool = False
    auto_offload: bool = False
    update_levers: Callable[[Any], tuple[str | None, str | None]] | None = None
    layout: Callable[[Any], Any] | None = None
    offload: Callable[[Any, Any], Any] | None = None
    compute_dtype: Callable[[Any], str | None] | None = None
    lora_reference_is_base: bool = False
    optimizer_share: Callable[[Any], tuple[Any, str]] | None = None
    applies_lora: bool = False
    device_levers: str = ""
    host_levers: str = ""
    idle_levers: str = ""
    swift_offload: dict[str, tuple[str, ...]] = field(default_factory=dict)
