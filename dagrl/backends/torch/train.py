"""Training backend on plain PyTorch + HF transformers: AdamW, grad clipping, micro-batch
accumulation, DDP over gloo (CPU) or NCCL (GPU) when the pool has several workers.

Used for the actor (train role) and, with forward_only=True, for the reference model.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

from dagrl.algos import LossAggMode, entropy_from_logits, logprobs_from_logits
from dagrl.backends.actor_loss import actor_loss, micro_batch_weights, rollout_correction, weight_buckets
from dagrl.backends.hf_model import load_causal_lm, load_tokenizer, resolve_model_path
from dagrl.core.batch import Batch, sequence_inputs
from dagrl.core.metrics import fold, reduce


class TorchTrainBackend:
    def __init__(self, cfg, ctx, forward_only: bool = False):
        self.cfg, self.ctx, self.forward_only = cfg, ctx, forward_only
        arr = cfg.actor_rollout_ref
        self.path = resolve_model_path(arr.model.path)
        torch.manual_seed(cfg.trainer.seed)
        self.model = load_causal_lm(self.path, arr.model.dtype, ctx.device, arr.model.trust_remote_code)
        self.temperature = arr.rollout.temperature
        self.optimizer = None
        self.ddp = None
        if forward_only:
            self.model.eval().requires_grad_(False)
            self.micro = arr.ref.log_prob_micro_batch_size_per_gpu
            return
        self.micro = arr.rollout.log_prob_micro_batch_size_per_gpu
        if arr.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        o = arr.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
        warmup = max(1, o.lr_warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup)
        )
        if ctx.distributed:
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

    # ---- placement -----------------------------------------------------------------------------
    def dp_info(self) -> tuple[int, int, bool]:
        return self.ctx.rank, self.ctx.world_size, True

    def offload(self) -> bool:
        if not self.cfg.actor_rollout_ref.actor.offload:  # the state stays resident on the GPU
            return False
        self._move(torch.device("cpu"))
        return True

    def onload(self) -> None:
        self._move(self.ctx.device)

    def _move(self, device: torch.device) -> None:
        self.model.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for k, v in state.items():
                    if isinstance(v, torch.Tensor) and k != "step":
                        state[k] = v.to(device)

    # ---- forward -------------------------------------------------------------------------------
    def _logits_logprobs(self, module, mb: Batch, with_entropy: bool):
        dev = self.ctx.device
        ids, attn, pos = sequence_inputs(
            mb["prompts"].to(dev),
            mb["prompt_mask"].to(dev),
            mb["responses"].to(dev),
            mb["response_mask"].to(dev),
        )
        resp_len = mb["responses"].shape[1]
        if dev.type == "cuda":
            return self._fused_logprobs(module, ids, attn, pos, resp_len, with_entropy)
        logits = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
        # logits at t predict token t+1: the response tokens are predicted by positions P-1 .. P+R-2
        logits = logits[:, -resp_len - 1 : -1].float() / self.temperature
        logprobs = logprobs_from_logits(logits, ids[:, -resp_len:])
        entropy = None
        if with_entropy:  # a metric unless entropy_coeff != 0: then no graph is kept for it
            with torch.set_grad_enabled(
                torch.is_grad_enabled() and self.cfg.actor_rollout_ref.actor.entropy_coeff != 0
            ):
                entropy = entropy_from_logits(logits)
        return logprobs, entropy

    def _fused_logprobs(self, module, ids, attn, pos, resp_len: int, with_entropy: bool):
        """GPU path: the output layer runs on the R+1 last positions only (prompt positions need no
        logits), and one fused pass over the bf16 logits gives log-probs and entropy without a
        fp32 [B, R, V] copy (the Triton kernel the megatron backend uses)."""
        from dagrl.backends.megatron.logprobs import response_logprobs  # torch + triton, no megatron

        logits = module(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=resp_len + 1
        ).logits  # [B, R+1, V]: position r predicts response token r
        rows, dev = ids.shape[0], ids.device
        # response_logprobs indexes logits[positions[n], rows[n]] of a [S, B, V] tensor: here S = rows
        batch_index = torch.arange(rows, device=dev).repeat_interleave(resp_len)
        token_index = torch.arange(resp_len, device=dev).repeat(rows)
        targets = ids[:, -resp_len:].reshape(-1)
        out = response_logprobs(
            logits, token_index, batch_index, targets, self.temperature, logits.shape[-1], with_entropy
        )
        logprobs, entropy = out if with_entropy else (out, None)
        if entropy is not None and self.cfg.actor_rollout_ref.actor.entropy_coeff == 0:
            entropy = entropy.detach()  # a metric only: no backward pass through it
        grid = (rows, resp_len)
        return logprobs.view(grid), entropy.view(grid) if entropy is not None else None

    @torch.no_grad()
    def forward_logprobs(self, batch: Batch, output_key: str) -> tuple[Batch, dict]:
        self.model.eval()
        out = [self._logits_logprobs(self.model, mb, False)[0].cpu() for mb in batch.chunks(self.micro)]
        return Batch({output_key: torch.cat(out)}), {}

    # ---- update --------------------------------------------------------------------------------
    def train_step(self, batch: Batch) -> tuple[Batch, dict]:
        assert not self.forward_only, "the reference model is not trained"
        actor = self.cfg.actor_rollout_ref.actor
        n = self.cfg.actor_rollout_ref.rollout.n
        mini_rows = actor.ppo_mini_batch_size * n // self.ctx.world_size
        module = self.ddp or self.model
        module.train()
        history: dict[str, list[float]] = {}
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed + self.scheduler.last_epoch)
        for _ in range(actor.ppo_epochs):
            order = torch.randperm(len(batch), generator=gen) if actor.shuffle else torch.arange(len(batch))
            for mini in batch.index(order).chunks(mini_rows):
                for k, v in self._update_mini_batch(module, mini).items():
                    history.setdefault(k, []).append(v)
        self.scheduler.step()
        metrics = {k: reduce(k, v) for k, v in history.items()}
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        if self.ctx.device.type == "cuda":
            metrics["perf/max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return Batch(), metrics

    def _update_mini_batch(self, module, mini: Batch) -> dict[str, float]:
        actor = self.cfg.actor_rollout_ref.actor
        mode = LossAggMode(actor.loss_agg_mode)
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = mini.chunks(actor.ppo_micro_batch_size_per_gpu)
        weights = micro_batch_weights(mini, micro_batches, mode)
        sums: dict[str, float] = {}
        for i, (mb, weight) in enumerate(zip(micro_batches, weights)):
            sync = i == len(micro_batches) - 1 or self.ddp is None
            ctx = module.no_sync() if not sync else contextlib.nullcontext()
            with ctx:
                loss, metrics = self._micro_loss(module, mb, mode)
                (loss * weight).backward()
            fold(sums, metrics, weight)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), actor.grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        sums["actor/grad_norm"] = grad_norm
        return {k: float(v) for k, v in sums.items()}  # the mini-batch's one sync with the device

    def _micro_loss(self, module, mb: Batch, mode: LossAggMode) -> tuple[torch.Tensor, dict]:
        logprobs, entropy = self._logits_logprobs(module, mb, True)
        return actor_loss(
            self.cfg.actor_rollout_ref.actor, mb, logprobs, entropy, mode, rollout_correction(self.cfg)
        )

    # ---- weights and checkpoints ---------------------------------------------------------------
    def export_weights(self, to_cpu: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        limit = self.cfg.actor_rollout_ref.rollout.weight_sync_bucket_mb * 2**20
        return weight_buckets(self.model.state_dict().items(), limit, to_cpu)

    def save(self, path: str) -> None:
        """Rank 0 writes the HF model; every rank its optimizer and RNG state."""
        os.makedirs(path, exist_ok=True)
        if self.ctx.rank == 0:
            self.export_hf(path)
        state = {"rng": _rng_state()}
        if self.optimizer is not None:
            state.update(optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict())
        torch.save(state, os.path.join(path, f"train_state_rank{self.ctx.rank}.pt"))

    def load(self, path: str) -> None:
        from safetensors.torch import load_file

        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        state = {}
        for f in files:
            state.update(load_file(os.path.join(path, f)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        assert not unexpected and set(missing) <= tied, f"checkpoint {path} mismatch: {missing} {unexpected}"
        extra = torch.load(os.path.join(path, f"train_state_rank{self.ctx.rank}.pt"), weights_only=False)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(extra["optimizer"])
            self.scheduler.load_state_dict(extra["scheduler"])
        _set_rng_state(extra["rng"])

    def export_hf(self, path: str) -> None:
        if self.ctx.rank != 0:  # DDP replicas hold the same weights: one writer
            return
        os.makedirs(path, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        load_tokenizer(self.path).save_pretrained(path)


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
