"""SFT: the negative log-likelihood of the data's responses (algorithm=sft, conf/dags/sft.yaml).

Supervised fine-tuning as one DAG node: the responses are the dataset's (data.response_key, or the
assistant turns of a multi-turn `messages` row), nothing is sampled, there is no reward, no
advantage and no reference model. The loss is ``agg(-log π(token))`` over the tokens the row
marks for training (``loss_mask``: the assistant turns of a conversation; every response token of
a single-response row), aggregated by actor.loss_agg_mode (token-mean by default, as verl's SFT
trainer does). Both train backends compute the sampled tokens' log-probs; nothing else is asked.

What it leaves out, and why: no label smoothing or NEFTune noise (not asked for by any workflow
dagrl serves); no loss on system/user/tool tokens (they are context, ms-swift's and verl's default).
"""

from __future__ import annotations

from torch import Tensor

from dagrl.algos import LossAggMode, agg_loss
from dagrl.config.schema import DagrlConfig
from dagrl.config.validate_rollout import refuse_rollout_correction
from dagrl.core.batch import Batch, declare_key
from dagrl.errors import ConfigError
from dagrl.objectives.base import TokenOutputs, TokenRequest, register_objective

# declared here, imported by the driver (node kinds) and by every train worker (the objective)
declare_key("loss_mask", "[B, R] 1 on response tokens the loss trains on (SFT: assistant turns only)")
declare_key("dataset_loss_mask", "[B, R] 1 on reference response tokens to train on (assistant turns)")

SFT_LOSS = "train/loss"  # verl's SFT trainer's name; validation reports it as val/loss


class SFTObjective:
    """``agg(-log π(response token))`` over the loss-masked response tokens."""

    required_keys = ("response_mask",)
    optional_keys = ("loss_mask",)  # absent: every response token trains
    request = TokenRequest(logprobs=True)

    def __init__(self, cfg: DagrlConfig):
        self.mode = LossAggMode(cfg.actor_rollout_ref.actor.loss_agg_mode)
        self.norm_length = cfg.data.max_response_length

    def micro_batch_weights(self, mini: Batch, micro_batches: list[Batch]) -> list[float]:
        """Each micro-batch's share of the mini-batch's trained tokens (rows for per-response modes)."""
        if self.mode.per_sequence:
            return [len(mb) / len(mini) for mb in micro_batches]
        total = float(_loss_mask(mini).sum().clamp(min=1))
        return [float(_loss_mask(mb).sum()) / total for mb in micro_batches]

    def loss(self, mb: Batch, out: TokenOutputs) -> tuple[Tensor, dict[str, Tensor]]:
        mask = _loss_mask(mb).to(out.logprobs.device).float()
        nll = agg_loss(-out.logprobs, mask, self.mode, self.norm_length)
        return nll, {SFT_LOSS: nll.detach()}


def _loss_mask(batch: Batch) -> Tensor:
    return batch["loss_mask"] if "loss_mask" in batch.tensors else batch["response_mask"]


def _check_sft(cfg: DagrlConfig) -> None:
    """SFT's own rules: one pass over each row (no sampling), and responses in the data."""
    arr = cfg.actor_rollout_ref
    refuse_rollout_correction(cfg)
    if arr.rollout.n != 1:
        raise ConfigError(
            "actor_rollout_ref.rollout.n",
            arr.rollout.n,
            "SFT trains on each row's own response once per epoch, nothing is sampled: set 1 (the "
            "algorithm=sft preset does)",
        )
    if cfg.dag != "sft":
        raise ConfigError(
            "dag", cfg.dag, "algorithm=sft trains on the data's responses: use dag=sft (the preset sets it)"
        )
    _check_response_column(cfg)


def _check_response_column(cfg: DagrlConfig) -> None:
    """Every training file has the response column (data.response_key) or `messages`."""
    from dagrl.config.validate import data_files
    from dagrl.objectives.distill import _parquet_columns

    column = cfg.data.response_key.partition(".")[0]
    for path in data_files(cfg.data.train_files):
        names = _parquet_columns(path)
        if names is not None and column not in names and "messages" not in names:
            raise ConfigError(
                "data.response_key",
                cfg.data.response_key,
                f"algorithm=sft trains on reference responses, but {path} has neither a column "
                f"{column!r} nor a `messages` column (its columns: {names}); point data.response_key "
                "at the response column (e.g. extra_info.answer) or write one",
            )


@register_objective("sft", validate=_check_sft)
def sft(cfg: DagrlConfig) -> SFTObjective:
    """SFT: NLL of the dataset's responses (assistant turns only for `messages` rows)."""
    return SFTObjective(cfg)
