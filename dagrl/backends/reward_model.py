"""Reward models as roles: a forward-only backend for sequence-classification models.

One model class serves three roles: `orm` (outcome reward: one score per response, read at its
last token), `prm` (process reward: a score at the last token of every step of a response, one
forward pass per response; dagrl/rewards/steps.py finds the step ends) and `rm` (GRPO's reward
node: reward.model.*). The model is an HF AutoModelForSequenceClassification with one label;
its head is applied to the backbone's final hidden states at the positions asked for, so the
ORM's score equals what the HF class returns for the whole sequence and the PRM's step scores
are the same head on each prefix (causal attention: a prefix's last hidden state does not see
what follows).
"""

from __future__ import annotations

import torch

from dagrl.backends.hf_model import resolve_model_path, torch_dtype
from dagrl.config.roles import RoleSpec
from dagrl.core.batch import Batch, declare_key, sequence_inputs
from dagrl.core.calls import Collect, Dispatch, Execute, role_method
from dagrl.errors import ConfigError

declare_key("rm_scores", "[B] a reward model's score of each response (orm / rm roles)")
declare_key("prm_step_ends", "[B, S] long: response index of each step's last token, -1 = no step")
declare_key("prm_step_scores", "[B, S] a process reward model's score after each step (0 where none)")


def load_reward_model(path: str, dtype: str, device: torch.device, trust_remote_code: bool, key: str):
    """An HF sequence-classification model with one label, on `device`, in eval mode."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code
    )
    if model.config.num_labels != 1 or not hasattr(model, "score"):
        raise ConfigError(
            key,
            path,
            f"a reward model is a sequence-classification model with one label and a `score` head "
            f"(got num_labels={model.config.num_labels}, {type(model).__name__}); train one with "
            "tools/build_tiny_reward_model.py as an example",
        )
    return model.to(device).eval().requires_grad_(False)


class RewardModelBackend:
    """Scores sequences with a sequence-classification head; forward-only, no optimizer."""

    def __init__(self, spec: RoleSpec, ctx):
        self.ctx, self.micro = ctx, spec.micro_batch_size
        path = resolve_model_path(spec.model.path) if spec.model.path else None
        if path is None:
            raise ConfigError(spec.backend_key, None, "the reward-model role needs a model directory")
        self.model = load_reward_model(
            path, spec.model.dtype, ctx.device, spec.model.trust_remote_code, spec.backend_key
        )
        self.base = getattr(self.model, self.model.base_model_prefix)

    def offload(self) -> bool:  # colocated on a GPU: frozen weights, reloaded from host memory
        self.model.to("cpu")
        return True

    def onload(self) -> None:
        self.model.to(self.ctx.device)

    @torch.no_grad()
    def _scores_at(self, mb: Batch, columns: torch.Tensor) -> torch.Tensor:
        """Head outputs [B, S] at response columns `columns` [B, S] (-1 = none: 0 there)."""
        dev = self.ctx.device
        ids, attn, pos = sequence_inputs(
            *(mb[k].to(dev) for k in ("prompts", "prompt_mask", "responses", "response_mask"))
        )
        hidden = self.base(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
        offset = mb["prompts"].shape[1]
        index = (columns.to(dev).clamp(min=0) + offset)[..., None].expand(-1, -1, hidden.shape[-1])
        picked = hidden.gather(1, index)  # [B, S, H]
        scores = self.model.score(picked)[..., 0].float()
        return torch.where(columns.to(dev) >= 0, scores, torch.zeros_like(scores)).cpu()

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def score(self, batch: Batch) -> Batch:
        """rm_scores [B]: the head at each response's last token (an empty response scores 0)."""
        out = []
        for mb in batch.chunks(self.micro):
            last = mb["response_mask"].sum(1).long() - 1  # -1 for an empty response
            out.append(self._scores_at(mb, last[:, None])[:, 0])
        return Batch({"rm_scores": torch.cat(out)})

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def score_steps(self, batch: Batch) -> Batch:
        """prm_step_scores [B, S]: the head at the last token of each step (prm_step_ends)."""
        out = [self._scores_at(mb, mb["prm_step_ends"]) for mb in batch.chunks(self.micro)]
        return Batch({"prm_step_scores": torch.cat(out)})
