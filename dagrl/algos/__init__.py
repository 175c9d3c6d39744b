"""Algorithm math: advantages, policy losses, KL estimators. Pure tensor functions."""

from dagrl.algos.advantages import compute_grpo_advantages
from dagrl.algos.gspo import compute_gspo_policy_loss
from dagrl.algos.losses import (
    KLEstimator,
    LossAggMode,
    agg_loss,
    compute_policy_loss,
    entropy_from_logits,
    kl_penalty,
    logprob_temperature,
    logprobs_from_logits,
    masked_mean,
    seq_mean_token_sum_norm,
)

__all__ = [
    "KLEstimator",
    "LossAggMode",
    "agg_loss",
    "compute_grpo_advantages",
    "compute_gspo_policy_loss",
    "compute_policy_loss",
    "entropy_from_logits",
    "kl_penalty",
    "logprob_temperature",
    "logprobs_from_logits",
    "masked_mean",
    "seq_mean_token_sum_norm",
]
