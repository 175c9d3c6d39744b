"""Mixed precision for the torch backend: bf16 compute weights, fp32 master weights and AdamW state.

AdamW's update at lr 1e-6 is ~1e-6 of a weight; bf16 keeps 8 bits of mantissa (a relative step
of 2^-8 ≈ 4e-3), so an update applied to bf16 weights rounds back to the old value almost
everywhere (0.2 % of a tiny model's weights changed after 3 steps). As in megatron's
Float16Optimizer and FSDP's mixed precision, the optimizer owns an fp32 copy of every low-precision
parameter: each step the compute-dtype gradients (accumulated on the model over the micro-batches,
all-reduced by DDP) are upcast into the masters' gradients, clipped by their global norm and applied
by AdamW in fp32; the result is rounded once into the compute weights the next forward uses.

fp32 models get no copy: AdamW runs on the parameters themselves, as it always did.

`host` (actor.optimizer_cpu_offload) puts the masters, their gradients and Adam's moments in
host memory and runs the step there (torch's fused CPU AdamW): the device keeps only the compute
weights and their gradients, at the price of one gradient copy to the host and one weight copy
back per step. Only the buffers those copies go through are pinned (page-locked): the masters and
moments are read and written by the host step (and checkpoints) where they are, and pinning is
dear: cudaHostAlloc locks every page, under a driver-wide lock, and torch's pinned allocator rounds
each block up to a power of two (Qwen3-8B's fp32 masters, 30.5 GiB, would lock 40.6). Bytes per
parameter (bf16): device 2 + 2 grads + 12 (master, m, v) = 16 resident, or 4 with the step on the
host, which then holds 12 pageable (master, m, v) and 6 pinned: the fp32 gradient and the bf16
staging copy, views into a few power-of-two slabs (backends/pinned.py: within a few MiB of the
bytes, where one allocation per kind, each rounded up, took 48 GiB for Qwen3-8B's 45.8).

fp16 is refused for training (it needs loss scaling, which this backend does not do): see
dagrl/config/validate.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dagrl.backends.pinned import carve
from dagrl.config.schema import OptimConfig


class MasterWeightsAdamW:
    """AdamW over fp32 masters of `params` (or over `params` themselves when they are fp32 and the
    step stays on their device). Offers the optimizer surface the backend and its tests use:
    param_groups, state, zero_grad, step (with clipping), state_dict, load_state_dict."""

    def __init__(
        self, params: list[torch.nn.Parameter], optim: OptimConfig, host: torch.device | None = None
    ):
        """`host`: the device the masters, their gradients and the step live on; None = the
        parameters' device."""
        self.params = [p for p in params if p.requires_grad]
        self.host = host
        device = self.params[0].device
        master_device = host or device
        self.copies = host is not None or any(p.dtype != torch.float32 for p in self.params)
        self.masters = self.params
        if self.copies:  # host masters never cross the bus asynchronously: pageable (module docstring)
            self.masters = [_empty(p, torch.float32, master_device).copy_(p.detach()) for p in self.params]
        if host is not None:
            # what crosses the bus each step, through reusable buffers: the gradients (upcast on the
            # device by the asynchronous copy, so fp32 crosses) and the rounded weights. Pinned,
            # as asynchronous copies need: from pageable memory they are staged by the driver
            assert host.type == "cpu", host
            like = [(p.shape, torch.float32) for p in self.params] + [(p.shape, p.dtype) for p in self.params]
            self._slabs, views = carve(like, pin=device.type == "cuda")
            self._grads, self._staging = views[: len(self.params)], views[len(self.params) :]
        kwargs = dict(lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=optim.weight_decay)
        if (self.copies and master_device.type == "cpu") or master_device.type == "cuda":
            # one fused kernel over p, g, m, v: on the GPU also no foreach temporaries (the
            # multi-tensor path allocates full-size fp32 intermediates: ~4-8 B/param at the step)
            kwargs["fused"] = True
        self.inner = torch.optim.AdamW(self.masters, **kwargs)
        self._create_moments()

    def _create_moments(self) -> None:
        """Have AdamW's state exist now, before any forward. Left to the first step, the moments
        (8 B per parameter, for the whole run) are carved out of cached blocks that the step's
        transient gradients and activations also use, and pin those segments in torch's cache:
        the hand-over's empty_cache cannot return them. On a GPU (4B torch, 2026-11-27) 13.7 GiB
        stayed reserved but unallocated at every hand-over, the rollout 14 GiB above the plan.

        The state is the one AdamW's first step creates (torch/optim/adam.py, Adam._init_group):
        m and v zeros like each master, a step count of 0 (float32, on the master's device for the
        fused kernel, on the CPU otherwise), so the first real step is exactly a lazy state's. It
        used to come from a step at lr 0 on zero gradients, which also allocated a zero gradient
        per master (4 B a parameter, at the peak) and ran a full AdamW pass: for a 0.4B model on
        the host that took 1.64 s and the process peaked at 7.3 GiB; the zeros alone take 0.61 s,
        with a 5.8 GiB peak (2 CPU cores, bench/torch_startup.py)."""
        for group in self.inner.param_groups:
            assert not group["amsgrad"], "AdamW's max_exp_avg_sq is not made here"
            on_param = group["fused"] or group["capturable"]
            for m in group["params"]:
                self.inner.state[m] = {
                    "step": torch.zeros((), dtype=torch.float32, device=m.device if on_param else "cpu"),
                    "exp_avg": torch.zeros_like(m, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(m, memory_format=torch.preserve_format),
                }

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The model's gradients (where backward accumulates); the masters' are rebuilt each step."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to `max_norm` by their global fp32 norm and apply them, unless that
        norm is not finite (then nothing changes); returns the norm before clipping."""
        if self.copies:
            self._gradients_to_masters()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters, max_norm)
        if torch.isfinite(grad_norm):  # a step on inf/nan gradients would ruin the weights
            self.inner.step()
            if self.copies:
                self._masters_to_params()
        if self.copies:  # fp32 gradients are rebuilt from the model's next step: free them now
            for m in self.masters:
                m.grad = None
        return grad_norm

    @torch.no_grad()
    def _gradients_to_masters(self) -> None:
        """Upcast (and, with a host, copy D2H) each parameter's gradient into its master's,
        freeing the compute-dtype gradient as it goes: the peak holds one of the two, not both.
        A parameter without a gradient (unused in this forward) gets no update, as in AdamW."""
        for i, (p, m) in enumerate(zip(self.params, self.masters)):
            if p.grad is None:
                continue
            m.grad = p.grad.float() if self.host is None else self._grads[i].copy_(p.grad, non_blocking=True)
            p.grad = None
        if self.host is not None and self.params[0].is_cuda:
            torch.cuda.synchronize()  # the host step reads the copies

    @torch.no_grad()
    def _masters_to_params(self) -> None:
        """Round the masters into the compute weights; from the host through pinned staging
        buffers (rounded there, so half the bytes cross the bus and the copy is asynchronous)."""
        for i, (p, m) in enumerate(zip(self.params, self.masters)):
            if self.host is None:
                p.copy_(m)
            else:
                p.copy_(self._staging[i].copy_(m), non_blocking=True)

    def masters_by_param(self) -> dict[torch.Tensor, torch.Tensor] | None:
        """Each trained parameter's fp32 master (what an export of the trained values reads);
        None when AdamW steps the parameters themselves."""
        return dict(zip(self.params, self.masters)) if self.copies else None

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """What a device offload moves: the masters and Adam's moments (those on the device)."""
        if self.copies:
            yield from self.masters
        for state in self.inner.state.values():
            yield from (v for k, v in state.items() if isinstance(v, torch.Tensor) and k != "step")

    def state_dict(self) -> dict:
        """AdamW's state, plus the fp32 masters when they are copies (a resumed run continues from
        them, not from the rounded weights, so it is bit-identical to an uninterrupted one)."""
        state = self.inner.state_dict()
        if self.copies:
            state = {**state, "master_weights": [m.detach() for m in self.masters]}
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore AdamW and the masters; a checkpoint without masters (written before they
        existed) restarts them from the loaded weights."""
        state = dict(state)
        masters = state.pop("master_weights", None)
        self.inner.load_state_dict(state)
        if not self.copies:
            return
        sources = masters if masters is not None else self.params
        for m, source in zip(self.masters, sources, strict=True):
            m.copy_(source)


def _empty(p: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(p.shape, dtype=dtype, device=device)


def host_buffer_sizes(numels: list[int], width: int) -> list[int]:
    """Bytes of the host step's pinned buffers for trained tensors of `numels` elements: an fp32
    gradient and a staging copy in the model's dtype (`width` bytes) each, as MasterWeightsAdamW
    carves them (the memory plan packs the same list: pinned.pinned_bytes)."""
    return [4 * n for n in numels] + [width * n for n in numels]


def device_bytes_per_param(compute_bytes: int, cpu_offload: bool) -> int:
    """Bytes per trained parameter the torch backend keeps on its device: weights and gradients in
    the compute dtype, then (unless the step runs on the host) fp32 Adam m and v and, for a
    low-precision model, the fp32 master: bf16 16, fp32 16, with optimizer_cpu_offload 4 / 8."""
    if cpu_offload:
        return 2 * compute_bytes
    return 2 * compute_bytes + 8 + (0 if compute_bytes == 4 else 4)
