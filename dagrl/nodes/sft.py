"""SFT's node kinds: the data's responses as the update's (sft_data) and the validation loss (val_loss)."""

from __future__ import annotations

from dagrl.backends.handles import train_role
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.objectives.sft import SFT_LOSS  # also declares loss_mask / dataset_loss_mask

_DATA = ("dataset_responses", "dataset_response_mask", "dataset_loss_mask")


@register_node_kind("sft_data")
class SFTDataNode:
    """The reference responses of the rows become the responses the update trains on; the loss
    mask marks the tokens it trains (assistant turns of a conversation, else the whole response)."""

    required_inputs = _DATA
    optional_inputs = ()
    outputs = ("responses", "response_mask", "loss_mask")
    remote = False

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        mask = batch["dataset_response_mask"]
        out = Batch(
            {
                "responses": batch["dataset_responses"],
                "response_mask": mask,
                "loss_mask": batch["dataset_loss_mask"],
            }
        )
        trained = batch["dataset_loss_mask"].sum(1).float()
        return NodeResult(out, {"sft/trained_tokens_mean": float(trained.mean())})


@register_node_kind("val_loss")
class ValLossNode:
    """Token-mean NLL of the validation rows' reference responses under the current actor (no
    gradient), reported as `loss` (the trainer names it val/loss)."""

    required_inputs = _DATA + ("prompts", "prompt_mask")
    optional_inputs = ()
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        handle = train_role(runtime, self.spec.role)
        seq = Batch(
            {
                "prompts": batch["prompts"],
                "prompt_mask": batch["prompt_mask"],
                "responses": batch["dataset_responses"],
                "response_mask": batch["dataset_response_mask"],
            }
        )
        pad = (-len(seq)) % handle.dp_size  # repeats so every DP rank gets a shard; cut after
        padded = Batch.concat([seq, seq.index(range(pad))]) if pad else seq
        out, _ = handle.forward_logprobs(padded, output_key="old_logprobs")
        logprobs = out["old_logprobs"][: len(seq)]
        mask = batch["dataset_loss_mask"].float()
        nll = float(-(logprobs * mask).sum() / mask.sum().clamp(min=1))
        return NodeResult(Batch(), {SFT_LOSS.split("/", 1)[1]: nll})
