"""PPO's value model on the torch backend: an HF decoder trunk (no output layer) and a scalar value
head on its last hidden state, trained by the shared update loop with the clipped value loss.

The head is a linear map hidden -> 1 initialised as HF initialises a token-classification head
(normal, std = the model's initializer_range; zero bias), which is what verl's critic loads
(AutoModelForTokenClassification, num_labels=1); it is kept in fp32 whatever the trunk's dtype.
The value of response token t is read at the position that predicts it (the last prompt token for
t = 0), so values, log-probs and rewards share the [B, R] grid.

What it leaves out, and why: sequence packing and a token budget for the values pass (the
critic's forward runs in micro-batches of rows; critic.use_dynamic_bsz cuts the update's), LoRA
on the critic, and the fused GPU log-prob kernel (a value head has no vocabulary).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from dagrl.backends import device_memory
from dagrl.backends.hf_model import resolve_model_path, torch_dtype
from dagrl.backends.host_store import HostStore
from dagrl.backends.memory import CRITIC_UPDATE_PHASE, VALUES_PHASE
from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW
from dagrl.backends.train_common import host_rng_state, set_host_rng_state, set_lr
from dagrl.backends.update_loop import run_update
from dagrl.config.roles import RoleSpec
from dagrl.core.batch import Batch, response_attention, sequence_inputs
from dagrl.core.micro_batches import micro_batches
from dagrl.objectives.base import TokenOutputs
from dagrl.objectives.value import ValueObjective, critic_metric_names

HEAD_FILE = "value_head.pt"


class ValueModel(nn.Module):
    """trunk (an HF base model) → last hidden state [B, S, H] → value head → values [B, S]."""

    def __init__(self, trunk: nn.Module, head: nn.Linear):
        super().__init__()
        self.trunk, self.head = trunk, head

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.trunk(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.head(hidden.float()).squeeze(-1)


def build_value_model(spec: RoleSpec, device: torch.device) -> ValueModel:
    """The trunk of `spec.model` in its dtype and a fresh fp32 head, seeded by `spec.seed`."""
    from transformers import AutoModel

    path = resolve_model_path(spec.model.path)
    torch.manual_seed(spec.seed)
    trunk = AutoModel.from_pretrained(
        path, dtype=torch_dtype(spec.model.dtype), trust_remote_code=spec.model.trust_remote_code
    )
    head = nn.Linear(trunk.config.hidden_size, 1)
    nn.init.normal_(head.weight, std=getattr(trunk.config, "initializer_range", 0.02))
    nn.init.zeros_(head.bias)
    return ValueModel(trunk, head).to(device)


class TorchCriticBackend:
    """The critic role: `compute_values` (the values node), `train_step` (critic_update), save/load
    and the colocation hand-over. Built from its spec (`spec.train.update` is critic.* resolved)."""

    def __init__(self, spec: RoleSpec, ctx):
        assert spec.train is not None and spec.train.update is not None, "the critic trains"
        self.spec, self.ctx, self.settings = spec, ctx, spec.train
        update = spec.train.update
        self.objective = ValueObjective(update.cliprange_value, update.loss_agg_mode)
        self.model = build_value_model(spec, ctx.device)
        if update.model.gradient_checkpointing:
            self.model.trunk.gradient_checkpointing_enable()
        self.optimizer = MasterWeightsAdamW(list(self.model.parameters()), update.optim)
        self.ddp = None
        if ctx.distributed:
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.steps = 0  # critic updates done: the LR schedule's and the shuffle's position
        self._host = HostStore()

    # ---- placement -----------------------------------------------------------------------------
    def dp_info(self) -> tuple[int, int, bool]:
        return self.ctx.rank, self.ctx.world_size, True

    def offload(self) -> bool:
        if not self.spec.offload.params:
            return False
        if not self._host.holds:
            self._host.offload(self._state_tensors())
        return True

    def onload(self) -> None:
        self._host.onload()

    def _state_tensors(self) -> Iterator[torch.Tensor]:
        yield from self.model.parameters()
        yield from self.optimizer.state_tensors()

    # ---- forward -------------------------------------------------------------------------------
    def _values(self, module, mb: Batch) -> torch.Tensor:
        """[B, R] values at the positions predicting each response token (position P-1+r)."""
        dev = self.ctx.device
        ids, attn, pos = sequence_inputs(
            mb["prompts"].to(dev),
            mb["prompt_mask"].to(dev),
            mb["responses"].to(dev),
            response_attention(mb).to(dev),
        )
        resp_len = mb["responses"].shape[1]
        return module(ids, attn, pos)[:, -resp_len - 1 : -1]

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> tuple[Batch, dict]:
        """The critic's values [B, R] of this shard, in micro-batches of forward_micro_batch_size;
        on a GPU the phase's device figures (device_memory.py), under the plan's name for it."""
        self.model.eval()
        cuda = self.ctx.device.type == "cuda"
        allocated = device_memory.phase_start() if cuda else 0
        out = [
            self._values(self.model, mb).cpu()
            for mb in micro_batches(batch, self.spec.logprob_micro_batch_size, None)
        ]
        metrics = device_memory.phase_metrics(VALUES_PHASE, allocated) if cuda else {}
        return Batch({"values": torch.cat(out)}), metrics

    # ---- update: the shared loop (backends/update_loop.py) drives the three methods below -------
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        (self.ddp or self.model).train()
        cuda = self.ctx.device.type == "cuda"
        allocated = device_memory.phase_start() if cuda else 0
        metrics = run_update(
            self, self.objective, batch, self.settings, self.spec.seed, self.ctx.world_size, self.steps
        )
        self.steps += 1
        metrics = critic_metric_names(metrics)
        if cuda:  # device_memory.py: figures that cannot exceed the card
            metrics.update(device_memory.phase_metrics(CRITIC_UPDATE_PHASE, allocated))
        return Batch(), metrics

    def set_lr(self, lr: float) -> None:
        set_lr(self.optimizer, lr)

    def forward_backward(self, micro: list[Batch], weights: list[float]) -> list[dict]:
        self.optimizer.zero_grad(set_to_none=True)
        module = self.ddp or self.model
        outputs = []
        for i, (mb, weight) in enumerate(zip(micro, weights)):
            sync = i == len(micro) - 1 or self.ddp is None  # DDP all-reduces on the last backward
            with contextlib.nullcontext() if sync else module.no_sync():
                out = TokenOutputs(values=self._values(module, mb))
                keys = self.objective.required_keys
                loss, metrics = self.objective.loss(Batch({k: mb[k].to(self.ctx.device) for k in keys}), out)
                (loss * weight).backward()
            outputs.append(metrics)
        return outputs

    def optimizer_step(self) -> torch.Tensor:
        return self.optimizer.step(self.settings.update.grad_clip)

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Rank 0 writes the trunk (an HF model directory) and the head; every rank its optimizer
        and RNG state."""
        os.makedirs(path, exist_ok=True)
        if self.ctx.rank == 0:
            self.model.trunk.save_pretrained(path, safe_serialization=True)
            torch.save(self.model.head.state_dict(), os.path.join(path, HEAD_FILE))
        state = {"rng": host_rng_state(), "steps": self.steps, "optimizer": self.optimizer.state_dict()}
        torch.save(state, os.path.join(path, f"critic_state_rank{self.ctx.rank}.pt"))

    def load(self, path: str) -> None:
        from safetensors.torch import load_file

        weights = {}
        for f in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
            weights.update(load_file(os.path.join(path, f)))
        missing, unexpected = self.model.trunk.load_state_dict(weights, strict=False)
        assert not missing and not unexpected, f"critic checkpoint {path}: {missing} {unexpected}"
        head = torch.load(os.path.join(path, HEAD_FILE), map_location=self.ctx.device, weights_only=True)
        self.model.head.load_state_dict(head)
        extra = torch.load(os.path.join(path, f"critic_state_rank{self.ctx.rank}.pt"), weights_only=False)
        self.steps = extra["steps"]
        self.optimizer.load_state_dict(extra["optimizer"])
        set_host_rng_state(extra["rng"])
