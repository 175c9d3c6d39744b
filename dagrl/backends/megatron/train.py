"""Training backend on megatron-core: TP/PP/VPP/EP/DP, sequence parallel, the distributed optimizer
and CPU offload, driven by `actor_rollout_ref.{actor,ref}.megatron.*`.

Every rank of a DP group receives the same DP shard (the pool shards by `dp_info`); micro-batches
go through megatron's forward-backward schedule (pipelined when PP > 1), the last stage turns
vocab-parallel logits into what the objective requests (log-probs, entropy), and the loss is the
objective's, in the update loop every train backend shares (backends/update_loop.py). With LoRA
(spec.lora) adapters go on the linear layers when the model is built (lora.py).
Used for the actor and, with forward_only=True, for the reference model and a colocated
distillation teacher (no DDP, no optimizer; distill_steps.py has the teacher's forward and the
student's GKD quantities).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from functools import partial

import torch
from megatron.core import parallel_state as mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from dagrl.algos import logprob_temperature
from dagrl.backends import device_memory
from dagrl.backends.flops import throughput_metrics
from dagrl.backends.hf_model import DTYPES, load_tokenizer, resolve_model_path
from dagrl.backends.host_store import HostStore
from dagrl.backends.logprob_kernel import response_logprobs
from dagrl.backends.megatron import checkpoint as ckpt
from dagrl.backends.megatron import distill_steps
from dagrl.backends.megatron import lora as lora_layers
from dagrl.backends.megatron.micro_inputs import MicroInputs, micro_inputs, padding_stats
from dagrl.backends.megatron.model import build_model, model_shape, transformer_config
from dagrl.backends.megatron.optimizer import build_optimizer, optimizer_config
from dagrl.backends.megatron.parallel import dp_info, init_parallel, replica_figures
from dagrl.backends.megatron.spec import layer_spec_for
from dagrl.backends.megatron.weights import export_hf_weights, load_hf_weights, save_hf
from dagrl.backends.train_common import allocated_gib, set_lr, teacher_metrics, teacher_phase_start
from dagrl.backends.update_loop import run_update
from dagrl.backends.weight_sync import weight_buckets
from dagrl.config.roles import RoleSpec
from dagrl.config.schema import LoraSync
from dagrl.core.batch import Batch
from dagrl.core.micro_batches import micro_batches
from dagrl.objectives import Objective, TokenOutputs


class MegatronTrainBackend:
    def __init__(self, spec: RoleSpec, ctx, objective: Objective | None = None):
        """Everything comes from the role's `spec`: model, megatron section, offload policy,
        micro-batches and train settings (`spec.train`); a trained spec takes the `objective` its
        update minimises. A spec that does not train builds a forward-only backend (a reference,
        or a teacher with its own model)."""
        from transformers import AutoConfig

        forward_only = not spec.trains
        self.ctx, self.forward_only, self.spec, self.settings = ctx, forward_only, spec, spec.train
        assert spec.megatron is not None and spec.train is not None, f"role {spec.name}: no megatron section"
        self.m = spec.megatron
        self.offload_policy = spec.offload
        self._teacher_head = None  # the teacher's output-layer shard (full-vocabulary GKD), lazily
        self.path = resolve_model_path(spec.model.path)
        self.temperature = logprob_temperature(self.settings.temperature)  # 0 (greedy) scores at 1
        self.micro = spec.logprob_micro_batch_size
        self.budget = self.settings.logprob_token_budget
        init_parallel(self.m, spec.seed)
        self.hf_config = AutoConfig.from_pretrained(self.path, trust_remote_code=spec.model.trust_remote_code)
        self.dtype = DTYPES[self.m.param_dtype]  # megatron/rules.py checked the name
        self.tcfg = transformer_config(
            self.hf_config, self.m, params_dtype=self.dtype, use_cpu_initialization=ctx.device.type == "cpu"
        )
        self.tcfg.pipeline_dtype = self.dtype
        self.packing = self.settings.packing
        spec = layer_spec_for(
            self.m.layer_spec, self.tcfg, self.packing
        )  # a spec or a vp_stage -> spec callable
        self.chunks = build_model(
            self.hf_config, self.tcfg, spec, vp_size=self.m.virtual_pipeline_model_parallel_size
        )
        for chunk in self.chunks:
            chunk.to(ctx.device)
        start = time.perf_counter()
        load_hf_weights(self.chunks, self.path)
        self.load_s = time.perf_counter() - start
        self.lora = self.spec.lora if self.spec.trains else None  # a separate reference is the base
        seed, sp = self.spec.seed, self.m.sequence_parallel
        self.adapted = lora_layers.apply_lora(self.chunks, self.lora, seed, sp) if self.lora else []
        self.model, self.optimizer = self._wrap(self.settings.update)
        assert forward_only or objective is not None, "a trained role needs its objective"
        self.objective = objective
        self.steps = 0  # updates done: the LR schedule's and the shuffle's position
        self.offload_freed_gib = 0.0
        self._host = HostStore()  # pinned host copies of the params' storages, reused
        self._resident = True  # False between offload() and onload()

    def _wrap(self, actor):
        """megatron DDP + optimizer for the actor; the reference stays a bare forward-only model.

        No Float16Module: the params are already in param_dtype and inputs are token ids; its
        fp32 cast of the full [B, S, V/TP] logits would cost a copy of the largest activation.
        The log-prob code upcasts only the response positions it needs.
        """
        model = list(self.chunks)
        if self.forward_only:
            for chunk in model:
                chunk.eval().requires_grad_(False)
            return model, None
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.m.use_distributed_optimizer,
        )
        model = [
            DistributedDataParallel(self.tcfg, ddp_cfg, chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(model)
        ]
        self.tcfg.finalize_model_grads_func = finalize_model_grads
        optimizer = build_optimizer(optimizer_config(actor, self.m, self.dtype), model)
        return model, optimizer

    # ---- placement -----------------------------------------------------------------------------
    def dp_info(self) -> tuple[int, int, bool]:
        return dp_info()

    def offload(self) -> bool:
        """Hand the device to a colocated role: what the offload policy names leaves it (weights and
        optimizer state to host memory; the gradient buffers are freed, not copied: the next
        update zeroes them anyway); the freed GiB is reported. False when nothing left."""
        if not self._resident:  # a second offload (another role's turn) keeps the first one's figure
            return True
        if not (self.offload_policy.params or self._offloads_grads() or self._offloads_optimizer()):
            return False
        before = allocated_gib()
        if self._offloads_optimizer():
            # First: the distributed optimizer's shard of an fp32 parameter (a critic's value head,
            # an fp32 model) is a view into the parameter buffer, which the weights' offload frees;
            # megatron's offload_to_cpu then copies from freed memory (CUDA "invalid argument").
            # Moved first, the shard becomes a copy of its own, which the step writes back.
            self.optimizer.offload_to_cpu()
        if self.offload_policy.params:
            self._offload_params()
            self._move_teacher_head(torch.device("cpu"))
        if self._offloads_grads():
            for chunk in self.model:  # storage resized to 0; restore_grad_buffers re-allocates zeros
                chunk.offload_grad_buffers(synchronize=True, empty_cache=False)
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        self.offload_freed_gib = before - allocated_gib()
        self._resident = False
        return True

    def onload(self) -> None:
        if self._resident:
            return
        self._resident = True
        if self.offload_policy.params:
            self._onload_params()
            self._move_teacher_head(self.ctx.device)
        if self._offloads_grads():
            for chunk in self.model:
                chunk.restore_grad_buffers(synchronize=True)
        if self._offloads_optimizer():
            self.optimizer.restore_from_cpu()

    def _move_teacher_head(self, device: torch.device) -> None:
        if self._teacher_head is not None:  # full-vocabulary GKD: the student's copy of it
            self._teacher_head = tuple(t if t is None else t.to(device) for t in self._teacher_head)

    def _offloads_grads(self) -> bool:
        return self.optimizer is not None and self.offload_policy.grads and self.ctx.device.type == "cuda"

    def _offloads_optimizer(self) -> bool:
        # megatron moves the optimizer state back with .cuda(): on a CPU device there is nowhere
        # to offload from, so the flag is a no-op there
        return self.optimizer is not None and self.offload_policy.optimizer and self.ctx.device.type == "cuda"

    def _offload_params(self) -> None:
        # Parameters stay the same objects (the optimizer and DDP keep pointing at them); only
        # their storage moves. Under the distributed optimizer many params are views of one
        # contiguous buffer: the store copies whole storages, each once.
        self._host.offload(self._params(), cpu_too=True)  # megatron allocates its own (resizable) storages

    def _onload_params(self) -> None:
        self._host.onload()

    def _params(self) -> Iterator[torch.nn.Parameter]:
        seen = set()
        for chunk in self.chunks:
            for p in chunk.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    # ---- inputs and schedule -------------------------------------------------------------------
    def _micro_inputs(self, mb: Batch, weight: float, loss_keys: tuple[str, ...] = ()) -> MicroInputs:
        # sequence parallel splits the sequence over the TP ranks: lengths are a multiple of TP
        multiple = self.m.tensor_model_parallel_size if self.m.sequence_parallel else 1
        return micro_inputs(mb, weight, loss_keys, self.ctx.device, multiple, self.packing)

    def _run_schedule(self, micros: list[MicroInputs], loss_fn: Callable, forward_only: bool) -> list[dict]:
        """megatron's forward(-backward) over the micro-batches; returns loss_fn's dicts (last stage)."""

        def forward_step(data_iterator, model):
            mi = next(data_iterator)
            # labels make GPTLogitsModel return the [S, B, V/TP] logits as they are (model.py)
            logits = model(
                input_ids=mi.input_ids,
                position_ids=mi.position_ids,
                attention_mask=mi.attention_mask,
                labels=mi.input_ids,
                rope_from_position_ids=mi.attention_mask is not None,
            )
            return logits, partial(loss_fn, mi)

        iters = [iter(micros) for _ in self.model]
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iters if len(iters) > 1 else iters[0],
            model=self.model,
            num_microbatches=len(micros),
            seq_length=micros[0].input_ids.shape[1],
            micro_batch_size=micros[0].input_ids.shape[0],
            forward_only=forward_only,
        )

    def _response_logprobs(self, mi: MicroInputs, logits: torch.Tensor, entropy: bool):
        """(log-probs [B, R], entropy [B, R] or None) from the [S, B, V/TP] logits; response
        padding outside the S columns gets 0."""
        out = response_logprobs(
            logits,
            mi.token_rows,
            mi.token_positions,
            mi.token_targets,
            self.temperature,
            self.hf_config.vocab_size,
            entropy,
            group=mpu.get_tensor_model_parallel_group(),
        )
        logprobs, ent = out if entropy else (out, None)
        grid = mi.response_shape[0] * mi.response_shape[1]

        def to_grid(values: torch.Tensor) -> torch.Tensor:
            full = values.new_zeros(grid).index_copy(0, mi.token_index, values)
            return full.view(mi.response_shape)

        return to_grid(logprobs), to_grid(ent) if entropy else None

    # ---- forward -------------------------------------------------------------------------------
    @torch.no_grad()
    def forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, dict]:
        """`ref_logprobs` on a LoRA actor are its base's (config/roles.py: role_aliases)."""
        with lora_layers.adapters_disabled(self.adapted, output_key == "ref_logprobs"):
            return self._forward_logprobs(batch, output_key)

    def _forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, dict]:
        for chunk in self.model:
            chunk.eval()

        def loss_fn(mi: MicroInputs, logits: torch.Tensor):
            logprobs, _ = self._response_logprobs(mi, logits, entropy=False)
            return logprobs.sum() * 0, {"logprobs": logprobs}

        start = time.perf_counter()
        micros = [self._micro_inputs(mb, 1.0) for mb in micro_batches(batch, self.micro, self.budget)]
        outputs = self._run_schedule(micros, loss_fn, forward_only=True)
        device_memory.note_phase_end()  # the log-prob pass's reserved peak, for the step's figure
        if not outputs:  # not the last pipeline stage: nothing to return
            return Batch(), {}
        metrics = self._throughput("logprob", micros, time.perf_counter() - start, 1)
        return Batch({output_key: torch.cat([o["logprobs"] for o in outputs]).cpu()}), metrics

    # ---- teacher (forward-only, distillation) ----------------------------------------------------
    @torch.no_grad()
    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, dict]:
        """The K most likely next tokens at every response position, log-probs over the whole
        vocabulary at `temperature`: per TP shard from the final hidden states, merged over K·TP."""
        head = distill_steps.output_head(self.chunks) if self._is_last_stage() else None
        per_micro = partial(distill_steps.teacher_topk_step, head, k, temperature, self.hf_config.vocab_size)
        return self._teacher_forward(batch, per_micro)

    @torch.no_grad()
    def teacher_hidden(self, batch: Batch) -> tuple[Batch, dict]:
        """Final hidden states [B, R, H] at the positions predicting each response token."""
        return self._teacher_forward(batch, distill_steps.teacher_hidden_step)

    def _teacher_forward(self, batch: Batch, per_micro: Callable) -> tuple[Batch, dict]:
        """Forward-only schedule over teacher micro-batches ending at the final hidden states
        (no logits); `per_micro(mi, hidden [S, B, H])` runs on the last stage, one micro-batch's
        hidden states alive at a time, and returns CPU-bound tensors on the [B, R] grid."""
        for chunk in self.model:
            chunk.eval()

        def loss_fn(mi: MicroInputs, hidden: torch.Tensor):
            return hidden.new_zeros(()), per_micro(mi, hidden)

        start = teacher_phase_start(self.ctx.device)
        micros = [self._micro_inputs(mb, 1.0) for mb in batch.chunks(self.settings.teacher_micro_batch_size)]
        with distill_steps.hidden_instead_of_logits(self.chunks, self.m.sequence_parallel):
            outputs = self._run_schedule(micros, loss_fn, forward_only=True)
        metrics = teacher_metrics(start, self.ctx.device, self.offload_freed_gib)
        if self.ctx.device.type == "cuda":  # every rank calls it: the driver keeps one rank's metrics
            metrics = replica_figures(metrics, "teacher")
        if not outputs:  # not the last pipeline stage: nothing to return
            return Batch(), metrics
        return Batch({k: torch.cat([o[k] for o in outputs]).cpu() for k in outputs[0]}), metrics

    def _is_last_stage(self) -> bool:
        return mpu.is_pipeline_last_stage(ignore_virtual=True)

    def _throughput(self, phase: str, micros: list[MicroInputs], seconds: float, passes: int) -> dict:
        shape = model_shape(self.tcfg, self.hf_config.vocab_size)
        gpus = self.m.tensor_model_parallel_size * self.m.pipeline_model_parallel_size
        input_ids = [mi.input_ids for mi in micros]
        return throughput_metrics(shape, phase, input_ids, seconds, passes, gpus, self.tcfg.gated_linear_unit)

    # ---- update: the shared loop (backends/update_loop.py) drives the three methods below -------
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        assert not self.forward_only, "the reference model is not trained"
        _, dp_size, _ = dp_info()
        for chunk in self.model:
            chunk.train()
        self._step_micros: list[MicroInputs] = []  # for the throughput metrics
        cuda = self.ctx.device.type == "cuda"
        allocated = device_memory.phase_start() if cuda else 0
        start = time.perf_counter()
        metrics = run_update(self, self.objective, batch, self.settings, self.spec.seed, dp_size, self.steps)
        self.steps += 1
        metrics.update(self._throughput("update", self._step_micros, time.perf_counter() - start, 3))
        metrics.update(padding_stats(self._step_micros).metrics())
        if cuda:  # device_memory.py: figures that cannot exceed the card
            figures = device_memory.update_metrics(allocated)
            figures["perf/offload_freed_gib"] = self.offload_freed_gib
            metrics.update(replica_figures(figures, "update"))
        else:
            metrics.update(device_memory.host_metrics())
        return Batch(), metrics

    def set_lr(self, lr: float) -> None:
        set_lr(self.optimizer, lr)

    def forward_backward(self, micro_batches: list[Batch], weights: list[float]) -> list[dict]:
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        keys = (*self.objective.required_keys, *self.objective.optional_keys)  # those the batch has
        micros = [self._micro_inputs(mb, w, keys) for mb, w in zip(micro_batches, weights)]
        self._step_micros += micros
        # metrics stay device tensors: a .item() per micro-batch would stall the schedule (the CPU
        # could no longer run ahead of the GPU); the shared loop syncs once per mini-batch
        return self._run_schedule(micros, partial(self._loss, len(micros)), forward_only=False)

    def optimizer_step(self) -> float | None:
        """Clip to actor.grad_clip and step, unless the gradients are not finite.

        megatron checks for inf/NaN only under fp16's loss scaler (which then skips the step itself
        and lowers the scale: reported as None, not as a non-finite update); with bf16/fp32 it would
        step on NaN gradients and ruin the weights. So the global norm (all-reduced over the ranks:
        all skip together) is taken first; a finite one costs one more grad copy and norm, since
        `step` prepares the (unchanged) gradients again.
        """
        if self.dtype != torch.float16:
            self.optimizer.prepare_grads()
            grad_norm = float(self.optimizer.get_grad_norm())
            if not math.isfinite(grad_norm):
                return grad_norm
        applied, grad_norm, _ = self.optimizer.step()
        return grad_norm if applied else None

    def _loss(self, n_micro: int, mi: MicroInputs, logits: torch.Tensor):
        request = self.objective.request
        out = TokenOutputs()
        if request.logprobs or request.entropy:
            logprobs, entropy = self._response_logprobs(mi, logits, entropy=request.entropy)
            if entropy is not None and not request.entropy_grad:  # a metric only: no entropy backward
                entropy = entropy.detach()
            out = TokenOutputs(logprobs=logprobs if request.logprobs else None, entropy=entropy)
        if request.logprobs_at is not None or request.full_vocab is not None:  # distillation (GKD)
            distilled = distill_steps.student_distill_outputs(
                mi, logits, request, self.hf_config.vocab_size, partial(self._teacher_output_layer, logits)
            )
            out.logprobs_at, out.divergence = distilled.get("logprobs_at"), distilled.get("divergence")
        loss, metrics = self.objective.loss(mi.batch, out)
        # megatron divides each micro-batch's loss by their number; the weight already averages
        return loss * (mi.weight * n_micro), metrics

    def _teacher_output_layer(self, logits: torch.Tensor, dtype: torch.dtype):
        """The teacher's output-layer rows of this rank's vocabulary shard, read once (frozen)."""
        if self._teacher_head is None:
            self._teacher_head = distill_steps.teacher_head_shard(
                self.objective.request.full_vocab.teacher_model,
                self.spec.model.trust_remote_code,
                logits.shape[-1],
                dtype,
                logits.device,
            )
        return self._teacher_head

    # ---- weights and checkpoints ---------------------------------------------------------------
    def export_weights(self, to_cpu: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        """Full HF-named tensors on every rank (a collective over TP/PP/EP), in buckets; with LoRA
        the merged weights, or (lora.sync = adapter) one bucket of the PEFT-named adapters."""
        limit = self.settings.weight_sync_bucket_mb * 2**20
        if self.lora is not None and self.lora.sync == LoraSync.adapter:
            return weight_buckets(lora_layers.adapter_tensors(self.adapted, self.tcfg), float("inf"), to_cpu)
        named = export_hf_weights(self.chunks, self.hf_config, lora_layers.merged_weight(self.adapted))
        return weight_buckets(named, limit, to_cpu)

    def save(self, path: str) -> None:
        """Sharded model + optimizer (+ step and RNG); the HF export is on demand (export_hf)."""
        os.makedirs(path, exist_ok=True)  # every rank: on several nodes each may see its own disk
        ckpt.save(path, self.model, self.optimizer, {"steps": self.steps}, keep=self._checkpointed())

    def load(self, path: str) -> None:
        extra = ckpt.load(path, self.model, self.optimizer, keep=self._checkpointed())
        self.steps = extra["steps"]

    def _checkpointed(self):
        return lora_layers.is_adapter_key if self.lora else None  # LoRA: the adapters, not the base

    def export_hf(self, path: str) -> None:
        """The HF model at path (LoRA: merged, with the PEFT adapter directory under path/adapter)."""
        save_hf(self.chunks, self.hf_config, path, weight=lora_layers.merged_weight(self.adapted))
        if self.lora is not None:
            lora_layers.save_adapter_dir(
                self.adapted, self.tcfg, self.lora, self.path, os.path.join(path, "adapter")
            )
        if torch.distributed.get_rank() == 0:
            load_tokenizer(self.path).save_pretrained(path)
