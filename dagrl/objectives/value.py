"""The critic's update objective: PPO's clipped value loss against the GAE returns
(dagrl/algos/value.py). Not keyed by `algorithm.name` (that is the actor's loss): the critic
backend builds it from its own section, critic.*."""

from __future__ import annotations

from torch import Tensor

from dagrl.algos import LossAggMode, masked_mean
from dagrl.algos.value import compute_value_loss
from dagrl.core.batch import Batch
from dagrl.objectives.base import TokenOutputs, TokenRequest, micro_batch_weights


class ValueObjective:
    """0.5 · agg(max((V - R)², (clip(V, V_old ± c) - R)²)) over the policy's tokens; the values at
    sampling time (`values`, from the values node) anchor the clip."""

    required_keys = ("response_mask", "values", "returns")
    optional_keys = ()
    request = TokenRequest()  # the critic's forward gives `values`; it has no vocabulary

    def __init__(self, cliprange_value: float, loss_agg_mode: LossAggMode):
        self.cliprange_value, self.mode = cliprange_value, LossAggMode(loss_agg_mode)

    def micro_batch_weights(self, mini: Batch, micro_batches: list[Batch]) -> list[float]:
        return micro_batch_weights(mini, micro_batches, per_token=not self.mode.per_sequence)

    def loss(self, mb: Batch, out: TokenOutputs) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb["response_mask"].float()
        loss, metrics = compute_value_loss(
            out.values, mb["values"].float(), mb["returns"].float(), mask, self.cliprange_value, self.mode
        )
        metrics["critic/vf_loss"] = loss.detach()
        metrics["critic/vpred_mean"] = masked_mean(out.values.detach(), mask)
        return loss, metrics


def critic_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """The update loop names its figures for the actor; these are the critic's: actor/lr ->
    critic/lr, train/nonfinite_grads -> critic/nonfinite_grads (the trainer counts the actor's
    skipped updates under train/)."""
    out = {}
    for key, value in metrics.items():
        for prefix in ("actor/", "train/"):
            if key.startswith(prefix):
                key = "critic/" + key[len(prefix) :]
                break
        out[key] = value
    return out
