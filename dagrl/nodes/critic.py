"""values / critic_update: PPO's value model (role critic) scores the sampled responses before the
advantage (GAE reads `values`) and learns the returns after it (the clipped value loss)."""

from __future__ import annotations

from dagrl.backends.handles import critic_role
from dagrl.config.critic_role import critic_runs
from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.nodes.logprob import sequence_inputs_for

_SEQ_INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")


@register_node_kind("values")
class ValuesNode:
    required_inputs = _SEQ_INPUTS
    optional_inputs = ("response_attention_mask",)  # multi-turn rows: observations are attended
    outputs = ("values",)
    remote = True

    inputs_for = staticmethod(sequence_inputs_for)

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return critic_runs(cfg)

    def run(self, runtime, batch):
        out, per_rank = critic_role(runtime, self.spec.role).compute_values(batch)
        return NodeResult(out, reduce_all(per_rank))  # on a GPU, the pass's device figures


@register_node_kind("critic_update")
class CriticUpdateNode:
    required_inputs = (*_SEQ_INPUTS, "values", "returns")
    optional_inputs = ("response_attention_mask",)
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return critic_runs(cfg)

    @staticmethod
    def inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
        required, optional = sequence_inputs_for(cfg)
        return (*required, "values", "returns"), optional

    def run(self, runtime, batch):
        _, per_rank = critic_role(runtime, self.spec.role).train_step(batch)
        return NodeResult(Batch(), reduce_all(per_rank))
