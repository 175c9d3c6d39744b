"""A plugin objective, registered the way a user's external_plugins module would: by name.

REINFORCE: -A × log p on the sampled tokens (no ratio, no clip), token mean. Run it with
`algorithm.name=reinforce external_plugins=[tests.plugins.reinforce_objective]`.
"""

from __future__ import annotations

from dagrl.algos import LossAggMode, agg_loss
from dagrl.objectives import TokenRequest, micro_batch_weights, register_objective

BUILT: list[Reinforce] = []  # every objective built, so tests can look at what it saw


class Reinforce:
    required_keys = ("response_mask", "advantages")
    optional_keys = ("old_logprobs", "ref_logprobs")
    request = TokenRequest(logprobs=True)

    def __init__(self):
        self.seen: list[set[str]] = []

    def micro_batch_weights(self, mini, micro_batches):
        return micro_batch_weights(mini, micro_batches, per_token=True)

    def loss(self, mb, out):
        self.seen.append(mb.keys())
        assert out.entropy is None  # not requested, not computed
        loss = agg_loss(-mb["advantages"] * out.logprobs, mb["response_mask"], LossAggMode.token_mean)
        return loss, {"actor/pg_loss": loss.detach()}


@register_objective("reinforce")
def build_reinforce(cfg) -> Reinforce:
    BUILT.append(Reinforce())
    return BUILT[-1]
