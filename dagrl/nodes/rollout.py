"""rollout: one sampled response per row on the rollout pool."""

from __future__ import annotations

from dagrl.backends.handles import rollout_role
from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of a step: the same step of a resumed run samples the same responses."""
    return (seed * 1_000_003 + step) % (2**31)


@register_node_kind("rollout")
class RolloutNode:
    required_inputs = ("prompts", "prompt_mask")
    optional_inputs = ()
    outputs = ("responses", "response_mask", "rollout_logprobs")
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        handle = rollout_role(runtime, self.spec.role)
        out, per_rank = handle.generate(batch, seed=step_seed(runtime.cfg.trainer.seed, runtime.step))
        metrics = reduce_all(per_rank)  # replicas' means (memory per phase, generate seconds)
        metrics["rollout/tokens_per_s"] = sum(m["rollout/tokens_per_s"] for m in per_rank)  # all replicas
        return NodeResult(out, metrics)


@register_node_kind("val_rollout")
class ValRolloutNode:
    """Validation sampling: rollout.val_kwargs, one fixed seed, any number of rows, generated in
    chunks of data.val_batch_size prompts (all at once when unset)."""

    required_inputs = ("prompts", "prompt_mask")
    optional_inputs = ()
    outputs = ("responses", "response_mask", "rollout_logprobs")
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        size = cfg.data.val_batch_size
        self.rows = size * cfg.actor_rollout_ref.rollout.val_kwargs.n if size else None

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        handle = rollout_role(runtime, self.spec.role)
        outs = []
        for chunk in batch.chunks(self.rows or len(batch)):
            pad = (-len(chunk)) % handle.dp_size  # pad with repeats so every DP rank gets a shard
            padded = Batch.concat([chunk, chunk.index(range(pad))]) if pad else chunk
            out, _ = handle.generate(padded, seed=step_seed(runtime.cfg.trainer.seed, 0), validate=True)
            outs.append(out.index(range(len(chunk))))
        return NodeResult(outs[0] if len(outs) == 1 else Batch.concat(outs))
