"""actor_update: the objective's epochs × mini-batches on the train pool (none in the first
trainer.critic_warmup steps: PPO's actor waits while its critic learns the values)."""

from __future__ import annotations

from dagrl.backends.handles import train_role
from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.core.row_values import per_row
from dagrl.objectives import build_objective

# what the backend's forward pass reads, whatever the objective
SEQUENCE_INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")


@register_node_kind("actor_update")
class ActorUpdateNode:
    # without a config: the sequence only; inputs_for adds what the configured objective reads
    required_inputs = SEQUENCE_INPUTS
    optional_inputs = ("response_attention_mask",)
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec, self.critic_warmup = spec, cfg.trainer.critic_warmup

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    @staticmethod
    def inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(required, optional) inputs: the sequence plus the keys of `algorithm.name`'s objective."""
        objective = build_objective(cfg)
        multi_turn = ("response_attention_mask",) if cfg.actor_rollout_ref.rollout.multi_turn.enable else ()
        required = tuple(dict.fromkeys((*SEQUENCE_INPUTS, *multi_turn, *objective.required_keys)))
        optional = (*objective.optional_keys, "response_attention_mask")  # multi-turn: observations attended
        return required, tuple(k for k in optional if k not in required)

    def run(self, runtime, batch):
        if runtime.step <= self.critic_warmup:  # steps count from 1: the critic learns alone first
            return NodeResult(Batch(), {"actor/critic_warmup": 1.0})
        # advantages that are one value per row travel as that value (core/row_values.py)
        _, per_rank = train_role(runtime, self.spec.role).train_step(per_row(batch))
        metrics = reduce_all(per_rank)
        return NodeResult(Batch(), metrics)
