"""old_logprob / ref_logprob: log-probs of the sampled responses under the actor / reference model."""

from __future__ import annotations

import numpy as np

from dagrl.backends.handles import train_role
from dagrl.config.validate_rollout import old_logprob_pass
from dagrl.core.node import NodeResult, register_node_kind

_SEQ_INPUTS = ("prompts", "prompt_mask", "responses", "response_mask")


def sequence_inputs_for(cfg) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required, optional): multi-turn rows need response_attention_mask, or the forward would
    not attend to the observations the policy saw."""
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        return (*_SEQ_INPUTS, "response_attention_mask"), ()
    return _SEQ_INPUTS, ("response_attention_mask",)


def logprob_result(runtime, spec, batch, output_key: str) -> NodeResult:
    """Log-probs of the responses on spec.role's train backend under output_key."""
    out, per_rank = train_role(runtime, spec.role).forward_logprobs(batch, output_key=output_key)
    # backends may report throughput as perf/logprob_*: name it after this node
    keys = set().union(*per_rank) if per_rank else set()
    metrics = {
        k.replace("perf/logprob_", f"perf/{spec.name}_"): float(np.mean([m[k] for m in per_rank if k in m]))
        for k in keys
    }
    return NodeResult(out, metrics)


@register_node_kind("old_logprob")
class OldLogprobNode:
    required_inputs = _SEQ_INPUTS
    optional_inputs = ("response_attention_mask",)  # multi-turn rows: observations are attended
    outputs = ("old_logprobs",)
    remote = True

    inputs_for = staticmethod(sequence_inputs_for)

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        # validate allows skipping only when the update is on-policy (one epoch over one mini-batch)
        return old_logprob_pass(cfg)

    def run(self, runtime, batch):
        return logprob_result(runtime, self.spec, batch, self.outputs[0])


@register_node_kind("ref_logprob")
class RefLogprobNode:
    required_inputs = _SEQ_INPUTS
    optional_inputs = ("response_attention_mask",)  # multi-turn rows: observations are attended
    outputs = ("ref_logprobs",)
    remote = True

    inputs_for = staticmethod(sequence_inputs_for)

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward

    def run(self, runtime, batch):
        return logprob_result(runtime, self.spec, batch, self.outputs[0])
