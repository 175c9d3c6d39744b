"""PPO's value model on megatron-core (critic.strategy=megatron): the GPTModel trunk the actor
builds (model.py) with a scalar value head in place of the vocabulary output layer, trained with
the clipped value loss through megatron's forward-backward schedule and the shared update loop.

The head is post-processing on the last stage: GPTModel's final norm, then a [hidden, 1] linear in
fp32 (normal(initializer_range) weight, zero bias: what the torch critic and verl's
AutoModelForTokenClassification start from). It is replicated on every TP rank (one output needs
no split): the head sees the whole hidden state (gathered from the sequence-parallel split), each
rank computes the same values and the same head gradient, and megatron's grad norm counts the
untagged head once. Values are read where the actor reads log-probs (micro_inputs.py), so they
sit on the [B, R] grid of the responses as the torch critic's.

What it leaves out, and why: pipeline and context parallelism (critic_rules.py refuses them),
sequence packing (the critic runs padded micro-batches, as the torch critic), LoRA.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from megatron.core.pipeline_parallel import get_forward_backward_func

from dagrl.backends import device_memory
from dagrl.backends.hf_model import DTYPES, resolve_model_path
from dagrl.backends.host_store import HostStore
from dagrl.backends.megatron import checkpoint as ckpt
from dagrl.backends.megatron.critic_rules import critic_megatron
from dagrl.backends.megatron.distill_steps import to_response_grid
from dagrl.backends.megatron.micro_inputs import MicroInputs, micro_inputs
from dagrl.backends.megatron.model import build_model, transformer_config
from dagrl.backends.megatron.optimizer import build_optimizer, optimizer_config
from dagrl.backends.megatron.parallel import dp_info, init_parallel, replica_figures
from dagrl.backends.megatron.spec import layer_spec_for
from dagrl.backends.megatron.weights import load_hf_weights
from dagrl.backends.memory import CRITIC_UPDATE_PHASE, VALUES_PHASE
from dagrl.backends.train_common import allocated_gib, set_lr
from dagrl.backends.update_loop import run_update
from dagrl.config.roles import RoleSpec
from dagrl.config.schema import MegatronConfig
from dagrl.core.batch import Batch
from dagrl.core.micro_batches import micro_batches
from dagrl.objectives.base import TokenOutputs
from dagrl.objectives.value import ValueObjective, critic_metric_names


class ValueHead(torch.nn.Module):
    """hidden [S, B, H] → values [S, B, 1] in fp32; called where GPTModel calls its output layer."""

    def __init__(self, hidden: int, std: float, seed: int, sequence_parallel: bool):
        super().__init__()
        # a generator of its own: every TP rank draws the same replicated head
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(1, hidden, generator=gen) * std)
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        if self.sequence_parallel:
            # every rank then holds the whole gradient of the gathered states: its backward keeps
            # this rank's slice of it (no reduce-scatter, which would sum TP equal copies)
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return F.linear(hidden.float(), self.weight, self.bias), None


def build_value_chunks(spec: RoleSpec, m: MegatronConfig, device: torch.device):
    """(hf_config, TransformerConfig, [GPTModel]) of the critic's trunk with HF weights and the value
    head installed as its output layer. PP = 1 (refused otherwise): one chunk, both ends."""
    from transformers import AutoConfig

    path = resolve_model_path(spec.model.path)
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=spec.model.trust_remote_code)
    dtype = DTYPES[m.param_dtype]
    tcfg = transformer_config(hf_config, m, params_dtype=dtype, use_cpu_initialization=device.type == "cpu")
    [chunk] = build_model(hf_config, tcfg, layer_spec_for(m.layer_spec, tcfg, False), vp_size=None)
    chunk.to(device)
    load_hf_weights([chunk], path)  # the vocabulary layer too (GPTModel has no switch for it), then
    # it goes: the head takes its place and its bytes are freed before DDP allocates grad buffers
    std = getattr(hf_config, "initializer_range", 0.02)
    chunk.output_layer = ValueHead(hf_config.hidden_size, std, spec.seed, tcfg.sequence_parallel).to(device)
    chunk.share_embeddings_and_output_weights = False  # a tied embedding is now the embedding only
    return hf_config, tcfg, [chunk]


class MegatronCriticBackend:
    """The critic role on megatron: `compute_values` (the values node), `train_step`
    (critic_update), save/load through megatron's sharded checkpoints, and the colocation
    hand-over. Built from its spec (`spec.megatron` is critic.megatron, `spec.train.update` critic.*)."""

    def __init__(self, spec: RoleSpec, ctx):
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        assert spec.train is not None and spec.train.update is not None, "the critic trains"
        self.spec, self.ctx, self.settings = spec, ctx, spec.train
        self.m = critic_megatron(spec)
        update = spec.train.update
        self.objective = ValueObjective(update.cliprange_value, update.loss_agg_mode)
        init_parallel(self.m, spec.seed)  # a colocated megatron actor set the same layout (rules)
        self.dtype = DTYPES[self.m.param_dtype]
        self.hf_config, self.tcfg, self.chunks = build_value_chunks(spec, self.m, ctx.device)
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.m.use_distributed_optimizer,
        )
        self.model = [DistributedDataParallel(self.tcfg, ddp_cfg, self.chunks[0])]
        self.tcfg.finalize_model_grads_func = finalize_model_grads
        self.optimizer = build_optimizer(optimizer_config(update, self.m, self.dtype), self.model)
        self.steps = 0  # critic updates done: the LR schedule's and the shuffle's position
        self.offload_freed_gib = 0.0
        self._host = HostStore()
        self._resident = True

    # ---- placement -----------------------------------------------------------------------------
    def dp_info(self) -> tuple[int, int, bool]:
        return dp_info()

    def offload(self) -> bool:
        """As the megatron actor's hand-over: weights (and optimizer state) to host memory by the
        offload policy, the gradient buffers freed (the next update zeroes them anyway)."""
        if not self._resident:
            return True
        on_cuda, policy = self.ctx.device.type == "cuda", self.spec.offload
        if not (policy.params or (on_cuda and (policy.grads or policy.optimizer))):
            return False
        before = allocated_gib()
        if on_cuda and policy.optimizer:  # before the weights: see MegatronTrainBackend.offload
            self.optimizer.offload_to_cpu()  # megatron moves it back with .cuda(): GPUs only
        if policy.params:
            self._host.offload(self._params(), cpu_too=True)
        if on_cuda and policy.grads:
            self.model[0].offload_grad_buffers(synchronize=True, empty_cache=False)
        if on_cuda:
            torch.cuda.empty_cache()
        self.offload_freed_gib = before - allocated_gib()
        self._resident = False
        return True

    def onload(self) -> None:
        if self._resident:
            return
        self._resident = True
        on_cuda, policy = self.ctx.device.type == "cuda", self.spec.offload
        self._host.onload()
        if on_cuda and policy.grads:
            self.model[0].restore_grad_buffers(synchronize=True)
        if on_cuda and policy.optimizer:
            self.optimizer.restore_from_cpu()

    def _params(self):
        seen = set()
        for p in self.chunks[0].parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield p

    # ---- forward -------------------------------------------------------------------------------
    def _run_schedule(self, micros: list[MicroInputs], loss_fn: Callable, forward_only: bool) -> list[dict]:
        def forward_step(data_iterator, model):
            mi = next(data_iterator)
            # labels make GPTLogitsModel return the head's output as it is: values [S, B, 1]
            values = model(
                input_ids=mi.input_ids, position_ids=mi.position_ids, attention_mask=None, labels=mi.input_ids
            )
            return values, partial(loss_fn, mi)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micros),
            model=self.model,
            num_microbatches=len(micros),
            seq_length=micros[0].input_ids.shape[1],
            micro_batch_size=micros[0].input_ids.shape[0],
            forward_only=forward_only,
        )

    def _micro(self, mb: Batch, weight: float, keys: tuple[str, ...] = ()) -> MicroInputs:
        multiple = (
            self.m.tensor_model_parallel_size if self.m.sequence_parallel else 1
        )  # SP splits the sequence
        return micro_inputs(mb, weight, keys, self.ctx.device, multiple, packing=False)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> tuple[Batch, dict]:
        """The critic's values [B, R] of this shard, in micro-batches of forward_micro_batch_size."""
        self.model[0].eval()

        def loss_fn(mi: MicroInputs, values: torch.Tensor):
            grid = response_values(mi, values)
            return grid.sum() * 0, {"values": grid}

        cuda = self.ctx.device.type == "cuda"
        allocated = device_memory.phase_start() if cuda else 0
        micros = [
            self._micro(mb, 1.0) for mb in micro_batches(batch, self.spec.logprob_micro_batch_size, None)
        ]
        outputs = self._run_schedule(micros, loss_fn, forward_only=True)
        metrics = self._figures(VALUES_PHASE, allocated) if cuda else {}
        return Batch({"values": torch.cat([o["values"] for o in outputs]).cpu()}), metrics

    def _figures(
        self, phase: str, allocated: int, offload_freed_gib: float | None = None
    ) -> dict[str, float]:
        """A phase's device figures (device_memory.py), the fullest card's of the DP replica: every
        rank runs the phase, the driver keeps one rank's metrics. `offload_freed_gib`: what the
        critic's last offload freed on this card (the update's, where it offloads)."""
        figures = device_memory.phase_metrics(phase, allocated)
        if offload_freed_gib is not None:
            figures[f"{phase}/offload_freed_gib"] = offload_freed_gib
        return replica_figures(figures, phase)

    # ---- update: the shared loop (backends/update_loop.py) drives the three methods below -------
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        _, dp_size, _ = dp_info()
        self.model[0].train()
        cuda = self.ctx.device.type == "cuda"
        allocated = device_memory.phase_start() if cuda else 0
        start = time.perf_counter()
        metrics = run_update(self, self.objective, batch, self.settings, self.spec.seed, dp_size, self.steps)
        self.steps += 1
        metrics["perf/critic_update_s"] = time.perf_counter() - start
        metrics = critic_metric_names(metrics)
        if cuda:
            metrics.update(self._figures(CRITIC_UPDATE_PHASE, allocated, self.offload_freed_gib))
        return Batch(), metrics

    def set_lr(self, lr: float) -> None:
        set_lr(self.optimizer, lr)

    def forward_backward(self, micro: list[Batch], weights: list[float]) -> list[dict]:
        self.model[0].zero_grad_buffer()
        self.optimizer.zero_grad()
        micros = [self._micro(mb, w, self.objective.required_keys) for mb, w in zip(micro, weights)]

        def loss_fn(mi: MicroInputs, values: torch.Tensor):
            loss, metrics = self.objective.loss(mi.batch, TokenOutputs(values=response_values(mi, values)))
            # megatron divides each micro-batch's loss by their number; the weight already averages
            return loss * (mi.weight * len(micros)), metrics

        return self._run_schedule(micros, loss_fn, forward_only=False)

    def optimizer_step(self) -> float | None:
        """As the megatron actor's: no step on a non-finite global norm (bf16/fp32 would apply it)."""
        if self.dtype != torch.float16:
            self.optimizer.prepare_grads()
            grad_norm = float(self.optimizer.get_grad_norm())
            if not math.isfinite(grad_norm):
                return grad_norm
        applied, grad_norm, _ = self.optimizer.step()
        return grad_norm if applied else None

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Trunk, head, fp32 main params, Adam moments, step and RNG: megatron's sharded format."""
        os.makedirs(path, exist_ok=True)
        ckpt.save(path, self.model, self.optimizer, {"steps": self.steps})

    def load(self, path: str) -> None:
        self.steps = ckpt.load(path, self.model, self.optimizer)["steps"]


def response_values(mi: MicroInputs, values: torch.Tensor) -> torch.Tensor:
    """[S, B, 1] → [B, R]: each response token's value at the position that predicts it (0 for
    response padding outside the S columns)."""
    return to_response_grid(mi, values[..., 0][mi.token_positions, mi.token_rows])
