"""Training backend on plain PyTorch + HF transformers: AdamW, grad clipping, micro-batch
accumulation, DDP over gloo (CPU) or NCCL (GPU) when the pool has several workers.

Used for the actor (train role) and, with forward_only=True, for the reference model and a
colocated distillation teacher (which offloads per teacher.offload). With LoRA (the spec's
`lora`) the model is wrapped by PEFT when it is built (lora.py): the optimizer sees the adapters
only, weights leave merged or as adapters, checkpoints hold the adapters, and `ref_logprobs` are
the base's (adapter disabled) when the reference runs on these workers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from dagrl.algos import entropy_from_logits, logprob_temperature, logprobs_from_logits
from dagrl.backends import device_memory
from dagrl.backends.hf_model import load_causal_lm, load_tokenizer, resolve_model_path
from dagrl.backends.host_store import HostStore
from dagrl.backends.output_layer import load_output_layer, output_layer
from dagrl.backends.torch import lora as lora_layers
from dagrl.backends.torch.distill import (
    final_hidden,
    grid_logprobs_at,
    hidden_divergence,
    student_logprobs_at,
    teacher_topk,
)
from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW
from dagrl.backends.torch.packed import packed_token_outputs
from dagrl.backends.train_common import (
    allocated_gib,
    host_rng_state,
    set_host_rng_state,
    set_lr,
    teacher_metrics,
    teacher_phase_start,
)
from dagrl.backends.update_loop import run_update
from dagrl.backends.weight_sync import weight_buckets
from dagrl.config.roles import RoleSpec
from dagrl.config.schema import LoraSync
from dagrl.core.batch import Batch, response_attention, sequence_inputs
from dagrl.core.micro_batches import micro_batches
from dagrl.core.packing import PaddingStats, sequence_lengths
from dagrl.objectives import Objective, TokenOutputs, TokenRequest


class TorchTrainBackend:
    def __init__(self, spec: RoleSpec, ctx, objective: Objective | None = None):
        """Everything comes from the role's `spec`: model, dtype, offload policy, micro-batches and
        the train settings (`spec.train`: packing, token budget, the update's section); a trained
        spec takes the `objective` its update minimises. A spec that does not train builds a
        forward-only backend (a reference, or a teacher with its own model)."""
        assert spec.train is not None, (
            f"role {spec.name!r}: a train backend's spec carries its train settings"
        )
        forward_only = not spec.trains
        assert forward_only or objective is not None, "a trained role needs its objective"
        self.ctx, self.forward_only, self.spec, self.settings = ctx, forward_only, spec, spec.train
        self.offload_params = spec.offload.params
        self.offload_freed_gib = 0.0
        self._host = HostStore()  # where offload() keeps the state between turns (pinned, reused)
        self._teacher_head: tuple[torch.Tensor, torch.Tensor | None] | None = None  # full-vocab GKD
        settings = spec.train
        self.path = resolve_model_path(spec.model.path)
        torch.manual_seed(spec.seed)
        self.model = load_causal_lm(self.path, spec.model.dtype, ctx.device, spec.model.trust_remote_code)
        self.lora = spec.lora
        if self.lora is not None:  # base frozen; adapters in its dtype, the only trained params
            self.model = lora_layers.apply_lora(self.model, self.lora)
        self.temperature = logprob_temperature(settings.temperature)  # 0 (greedy) scores at 1
        self.packing = settings.packing
        self.padding = PaddingStats()  # token counts of this step's update, for the perf metrics
        self.optimizer = None
        self.ddp = None
        self.steps = 0  # updates done: the LR schedule's and the shuffle's position
        self.budget = settings.logprob_token_budget
        self.micro = spec.logprob_micro_batch_size
        if forward_only:
            self.model.eval().requires_grad_(False)
            return
        if settings.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.lora is not None:  # frozen embeddings: the recomputed segments need an input grad
                self.model.enable_input_require_grads()
        self.objective = objective
        # bf16 weights compute, fp32 masters and Adam state update them (mixed_precision.py)
        update = settings.update
        host = torch.device("cpu") if update.optimizer_cpu_offload else None
        self.optimizer = MasterWeightsAdamW(list(self.model.parameters()), update.optim, host)
        if ctx.distributed:
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

    # ---- placement -----------------------------------------------------------------------------
    def dp_info(self) -> tuple[int, int, bool]:
        return self.ctx.rank, self.ctx.world_size, True

    def offload(self) -> bool:
        if not self.offload_params:  # the state stays resident on the GPU
            return False
        if not self._host.holds:  # a second offload (another role's turn) keeps the first one's figure
            before = allocated_gib()
            self._host.offload(self._state_tensors())
            self.offload_freed_gib = before - allocated_gib()
        return True

    def onload(self) -> None:
        self._host.onload()

    def _state_tensors(self) -> Iterator[torch.Tensor]:
        """What offload moves: parameters, the full-vocabulary teacher head, Adam's moments."""
        yield from self.model.parameters()
        if self._teacher_head is not None:
            yield from (t for t in self._teacher_head if t is not None)
        if self.optimizer is not None:  # fp32 masters and Adam's moments (those on the device)
            yield from self.optimizer.state_tensors()

    # ---- forward -------------------------------------------------------------------------------
    def _token_outputs(self, module, mb: Batch, request: TokenRequest) -> TokenOutputs:
        dev = self.ctx.device
        if self.packing:
            out, packed = packed_token_outputs(module, mb, request, self.temperature, dev)
            self.padding.add(packed.real_tokens, packed.padded_tokens, packed.packed_tokens)
            return out
        self.padding.add(
            sequence_lengths(mb["prompt_mask"], response_attention(mb)),
            mb["prompts"].numel() + mb["responses"].numel(),
        )
        ids, attn, pos = sequence_inputs(
            mb["prompts"].to(dev),
            mb["prompt_mask"].to(dev),
            mb["responses"].to(dev),
            response_attention(mb).to(dev),
        )
        resp_len = mb["responses"].shape[1]
        if request.full_vocab is not None:
            return self._full_vocab_outputs(module, ids, attn, pos, mb, request)
        if dev.type == "cuda":
            return self._fused_outputs(module, ids, attn, pos, resp_len, mb, request)
        raw = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
        # logits at t predict token t+1: the response tokens are predicted by positions P-1 .. P+R-2
        raw = raw[:, -resp_len - 1 : -1]
        logits = raw.float() / self.temperature
        out = TokenOutputs(logprobs_at=self._logprobs_at(raw, mb, request))
        if request.logprobs:
            out.logprobs = logprobs_from_logits(logits, ids[:, -resp_len:])
        if request.entropy:  # without entropy_grad a metric only: then no graph is kept for it
            with torch.set_grad_enabled(torch.is_grad_enabled() and request.entropy_grad):
                out.entropy = entropy_from_logits(logits)
        return out

    def _logprobs_at(self, logits, mb: Batch, request: TokenRequest):
        """The request's log-probs at given ids from the response positions' logits [B, R, V]."""
        if request.logprobs_at is None:
            return None
        ids = mb[request.logprobs_at].to(logits.device)
        return grid_logprobs_at(logits, ids, request.logprobs_at_temperature)

    def _fused_outputs(self, module, ids, attn, pos, resp_len: int, mb: Batch, request: TokenRequest):
        """GPU path: the output layer runs on the R+1 last positions only (prompt positions need no
        logits), and one fused pass over the bf16 logits gives log-probs and entropy without a
        fp32 [B, R, V] copy (the Triton kernel the megatron backend uses)."""
        from dagrl.backends.logprob_kernel import response_logprobs

        logits = module(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=resp_len + 1
        ).logits  # [B, R+1, V]: position r predicts response token r
        rows, dev = ids.shape[0], ids.device
        # response_logprobs indexes logits[positions[n], rows[n]] of a [S, B, V] tensor: here S = rows
        batch_index = torch.arange(rows, device=dev).repeat_interleave(resp_len)
        token_index = torch.arange(resp_len, device=dev).repeat(rows)
        targets = ids[:, -resp_len:].reshape(-1)
        res = response_logprobs(
            logits, token_index, batch_index, targets, self.temperature, logits.shape[-1], request.entropy
        )
        logprobs, entropy = res if request.entropy else (res, None)
        grid = (rows, resp_len)
        out = TokenOutputs(
            logprobs=logprobs.view(grid), logprobs_at=self._logprobs_at(logits[:, :-1], mb, request)
        )
        if entropy is not None:  # without entropy_grad a metric only: no backward pass through it
            out.entropy = (entropy if request.entropy_grad else entropy.detach()).view(grid)
        return out

    def _full_vocab_outputs(self, module, ids, attn, pos, mb: Batch, request: TokenRequest) -> TokenOutputs:
        """The exact full-vocabulary divergence to the teacher, both models' logits made chunk by
        chunk of response tokens from final hidden states (``hidden_divergence``): the forward
        keeps one position's logits (``logits_to_keep=1``) and the teacher's hidden states are the
        teacher_hidden node's, so no [tokens, V] tensor outlives a chunk. With request.logprobs the
        sampled tokens' log-probs come from the same hidden states, chunked too (GKD's SFT term)."""
        full = request.full_vocab
        out = module(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=1,
        )  # through the DDP wrapper, so its gradient hooks see this forward
        hidden = out.hidden_states[-1]  # [B, S, H] after the final norm: what the head maps
        mask = mb["response_mask"].to(ids.device)
        rows, cols = mask.nonzero(as_tuple=True)
        seq, resp_len = ids.shape[1], mask.shape[1]
        student_rows = rows * seq + (seq - resp_len - 1 + cols)  # position P-1+c predicts token c
        teacher_hidden = mb[full.hidden_key].to(ids.device)  # [B, R, H']
        teacher_rows = rows * resp_len + cols
        per_token = hidden_divergence(
            hidden.flatten(0, 1),
            student_rows,
            output_layer(self.model),
            teacher_hidden.flatten(0, 1),
            teacher_rows,
            self._teacher_output_layer(full.teacher_model, teacher_hidden.dtype),
            full.beta,
            full.temperature,
        )
        grid = per_token.new_zeros(mask.shape).index_put((rows, cols), per_token)
        result = TokenOutputs(divergence=grid)
        if request.logprobs:
            weight, bias = output_layer(self.model)
            token_ids = mb["responses"].to(ids.device)[rows, cols][:, None]
            lp = student_logprobs_at(
                hidden.flatten(0, 1), student_rows, token_ids, weight, bias, self.temperature
            )
            result.logprobs = per_token.new_zeros(mask.shape).index_put((rows, cols), lp[:, 0])
        return result

    def _teacher_output_layer(
        self, path: str, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The teacher's output layer, read from its checkpoint once and kept on the device (frozen)."""
        if self._teacher_head is None:
            weight, bias = load_output_layer(path, self.spec.model.trust_remote_code)
            self._teacher_head = tuple(
                None if t is None else t.to(self.ctx.device, dtype) for t in (weight, bias)
            )
        return self._teacher_head

    @torch.no_grad()
    def forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, dict]:
        """Log-probs of the responses under output_key. `ref_logprobs` are the reference's by the
        batch's declaration: on a LoRA actor (the ref role runs here, config/roles.py:
        role_aliases) that is the base, so the adapter is off for them."""
        self.model.eval()
        request = TokenRequest(logprobs=True)
        reference = self.lora is not None and output_key == "ref_logprobs"
        with lora_layers.base_only(self.model) if reference else contextlib.nullcontext():
            out = [
                self._token_outputs(self.model, mb, request).logprobs.cpu()
                for mb in micro_batches(batch, self.micro, self.budget)
            ]
        device_memory.note_phase_end()  # the log-prob pass's reserved peak, for the step's figure
        return Batch({output_key: torch.cat(out)}), {}

    def _teacher_micro_batches(self, batch: Batch):
        """(micro-batch rows, final hidden states [B*S, H], flat rows [B*R] of the positions that
        predict each response token, padding included), one teacher micro-batch at a time."""
        self.model.eval()
        dev = self.ctx.device
        for mb in batch.chunks(self.settings.teacher_micro_batch_size):
            ids, attn, pos = sequence_inputs(
                *(
                    t.to(dev)
                    for t in (mb["prompts"], mb["prompt_mask"], mb["responses"], response_attention(mb))
                )
            )
            rows, seq = ids.shape
            resp_len = mb["responses"].shape[1]
            hidden = final_hidden(self.model, ids, attn, pos).flatten(0, 1)
            # position P-1+r predicts response token r: every cell of the [B, R] grid, padding too
            starts = torch.arange(rows, device=dev) * seq + seq - resp_len - 1
            yield rows, resp_len, hidden, (starts[:, None] + torch.arange(resp_len, device=dev)).reshape(-1)

    @torch.no_grad()
    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, dict]:
        """The K most likely next tokens at every response position and their log-probs over the
        whole vocabulary at `temperature`: teacher_topk_ids / teacher_topk_logprobs [B, R, K]."""
        start = teacher_phase_start(self.ctx.device)
        head = output_layer(self.model)
        ids_out, logprobs_out = [], []
        for rows, resp_len, hidden, grid in self._teacher_micro_batches(batch):
            top_ids, top_logprobs = teacher_topk(hidden, grid, head[0], k, head[1], temperature)
            ids_out.append(top_ids.view(rows, resp_len, k).cpu())
            logprobs_out.append(top_logprobs.view(rows, resp_len, k).cpu())
        out = {"teacher_topk_ids": torch.cat(ids_out), "teacher_topk_logprobs": torch.cat(logprobs_out)}
        return Batch(out), teacher_metrics(start, self.ctx.device, self.offload_freed_gib)

    @torch.no_grad()
    def teacher_hidden(self, batch: Batch) -> tuple[Batch, dict]:
        """Final hidden states [B, R, H] at the positions predicting each response token."""
        start = teacher_phase_start(self.ctx.device)
        out = [
            hidden[grid].view(rows, resp_len, -1).cpu()
            for rows, resp_len, hidden, grid in self._teacher_micro_batches(batch)
        ]
        return Batch({"teacher_hidden": torch.cat(out)}), teacher_metrics(
            start, self.ctx.device, self.offload_freed_gib
        )

    # ---- update: the shared loop (backends/update_loop.py) drives the three methods below -------
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        assert not self.forward_only, "the reference model is not trained"
        (self.ddp or self.model).train()
        self.padding = PaddingStats()
        cuda = self.ctx.device.type == "cuda"
        allocated = device_memory.phase_start() if cuda else 0
        metrics = run_update(
            self, self.objective, batch, self.settings, self.spec.seed, self.ctx.world_size, self.steps
        )
        self.steps += 1
        metrics.update(self.padding.metrics())
        if cuda:  # device_memory.py: figures that cannot exceed the card, and the host's
            metrics.update(device_memory.update_metrics(allocated))
        else:
            metrics.update(device_memory.host_metrics())
        return Batch(), metrics

    def set_lr(self, lr: float) -> None:
        set_lr(self.optimizer, lr)

    def forward_backward(self, micro_batches: list[Batch], weights: list[float]) -> list[dict]:
        self.optimizer.zero_grad(set_to_none=True)
        module = self.ddp or self.model
        keys = (*self.objective.required_keys, *self.objective.optional_keys)  # those the batch has
        outputs = []
        for i, (mb, weight) in enumerate(zip(micro_batches, weights)):
            # DDP all-reduces the gradients once, on the mini-batch's last backward
            sync = i == len(micro_batches) - 1 or self.ddp is None
            with contextlib.nullcontext() if sync else module.no_sync():
                out = self._token_outputs(module, mb, self.objective.request)
                on_device = Batch({k: mb[k].to(self.ctx.device) for k in keys if k in mb})
                loss, metrics = self.objective.loss(on_device, out)
                (loss * weight).backward()
            outputs.append(metrics)
        return outputs

    def optimizer_step(self) -> torch.Tensor:
        """Clip and step on the fp32 masters; skipped (weights unchanged) on inf/nan gradients."""
        return self.optimizer.step(self.settings.update.grad_clip)

    # ---- weights and checkpoints ---------------------------------------------------------------
    def export_weights(self, to_cpu: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        """HF-named buckets of the weights; with LoRA the merged weights under the base's names,
        or (lora.sync = adapter) one bucket of the adapter tensors only."""
        limit = self.settings.weight_sync_bucket_mb * 2**20
        if self.lora is None:
            return weight_buckets(self.model.state_dict().items(), limit, to_cpu)
        if self.lora.sync == LoraSync.adapter:
            return weight_buckets(lora_layers.adapter_weights(self.model).items(), float("inf"), to_cpu)
        return weight_buckets(lora_layers.merged_weights(self.model), limit, to_cpu)

    def _lora_masters(self):
        """The adapters' fp32 masters (None: the adapters are fp32 and stepped in place)."""
        return self.optimizer.masters_by_param() if self.optimizer is not None else None

    def save(self, path: str) -> None:
        """Rank 0 writes the HF model (with LoRA: the PEFT adapter directory only, of the fp32
        masters; the base is model.path's); every rank its optimizer and RNG state."""
        os.makedirs(path, exist_ok=True)
        if self.ctx.rank == 0 and self.lora is not None:
            lora_layers.save_adapter(self.model, path, self._lora_masters())
        elif self.ctx.rank == 0:
            self.export_hf(path)
        state = {"rng": host_rng_state(), "steps": self.steps}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, os.path.join(path, f"train_state_rank{self.ctx.rank}.pt"))

    def load(self, path: str) -> None:
        from safetensors.torch import load_file

        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        state = {}
        for f in files:
            state.update(load_file(os.path.join(path, f)))
        if self.lora is not None:  # the adapters; the frozen base is model.path's, as loaded
            lora_layers.load_adapter_weights(self.model, state)
        else:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            assert not unexpected and set(missing) <= tied, (
                f"checkpoint {path} mismatch: {missing} {unexpected}"
            )
        extra = torch.load(os.path.join(path, f"train_state_rank{self.ctx.rank}.pt"), weights_only=False)
        self.steps = extra["steps"]
        if self.optimizer is not None:
            self.optimizer.load_state_dict(extra["optimizer"])
        set_host_rng_state(extra["rng"])

    def export_hf(self, path: str) -> None:
        if self.ctx.rank != 0:  # DDP replicas hold the same weights: one writer
            return
        os.makedirs(path, exist_ok=True)
        if self.lora is None:
            self.model.save_pretrained(path, safe_serialization=True)
        else:  # a merged HF model at path, the PEFT adapter directory under it: of the masters
            lora_layers.save_merged(self.model, path, self._lora_masters())
        load_tokenizer(self.path).save_pretrained(path)
