"""The torch train backend's own rules, registered with it (dagrl/backends/builtin.py) and run
by validate when a role uses it, before Ray starts."""

from __future__ import annotations

from dagrl.backends.megatron.rules import check_no_megatron_knobs
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError


def check_torch(cfg: DagrlConfig) -> None:
    """Data-parallel only (no model-parallel knob), and packing only for models transformers
    implements itself."""
    check_no_megatron_knobs(cfg)
    model = cfg.actor_rollout_ref.model
    if model.use_remove_padding and model.trust_remote_code:
        # packing relies on transformers' own masks reading sequence starts from the position ids
        # (docs/packing.md); a repository's own modelling code may ignore them and mix sequences
        raise ConfigError(
            "actor_rollout_ref.model.use_remove_padding",
            True,
            "the torch backend packs for models transformers implements itself; with"
            " trust_remote_code=true set use_remove_padding=false (or use actor.strategy=megatron)",
        )
