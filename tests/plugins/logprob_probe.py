"""A plugin node kind that requires the rollout engine's log-probs (tests/config/test_logprob_readers.py)."""

from dagrl.core.node import NodeResult, register_node_kind


@register_node_kind("logprob_probe")
class LogprobProbe:
    """Reports the mean rollout log-prob: reads the engine's log-probs, makes nothing."""

    required_inputs = ("rollout_logprobs", "response_mask")
    optional_inputs = ()
    outputs = ()
    remote = False

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        mask = batch["response_mask"].float()
        return NodeResult(
            None, {"probe/logprob": float((batch["rollout_logprobs"] * mask).sum() / mask.sum())}
        )
