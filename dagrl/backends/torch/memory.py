"""Memory of the torch train backend (HF transformers model, AdamW, DDP) per device, in bytes.

State per parameter (w = bytes of the model dtype): weights w and gradients w; AdamW keeps m and v
in fp32 (8 B) and, for bf16/fp16 weights, an fp32 master copy (4 B): 16 B per trained parameter in
bf16, as megatron's mixed precision. With LoRA (model.lora_rank > 0) the base is frozen (its
weights only, no gradient, master or moments) and the adapters are what trains, held as every
trained weight is: w of weights, w of gradients (during the update only, for bf16), fp32 master
(bf16) and moments (lora.py). With the optimizer step on the host (actor.optimizer_cpu_offload)
the device keeps weights and gradients only; the host 12 B a trained parameter (fp32 master, m,
v) and two pinned buffers, one allocation each, rounded up to a power of two: the fp32 gradients
and a staging copy in the model's dtype (w). `actor.offload` moves weights and optimizer state to
host memory while a colocated role has the device; gradients stay (they live until the next
update's zero_grad).

Activations per token per layer of an HF decoder layer, counted on the tensors autograd saves
(CPU, sdpa attention, Qwen3 shapes; the norms upcast to fp32): (8 + 4w)·h + (4 + 3w)·(q + kv) +
4w·i bytes, h hidden, q/kv the query/key-value widths, i the MLP width. With gradient
checkpointing each layer keeps its input (w·h) and one layer is recomputed at a time, after the
logits and their gradient are gone (the peak holds the larger of the two: update_bytes). The logits:
the GPU path runs the output layer on the R + 1 response positions only and keeps those logits
in the model dtype; the backward adds their gradient of the same size. Gradients in the compute
dtype exist only during the update when fp32 masters (or the host step) take them.
"""

from __future__ import annotations

from dagrl.backends.communicators import GROUP_BYTES
from dagrl.backends.memory import (
    CRITIC_UPDATE_PHASE,
    VALUES_PHASE,
    RoleMemory,
    Workload,
    forward_phases,
    param_width,
    parts_total,
    teacher_forward_bytes,
    update_workload,
    workload,
)
from dagrl.backends.model_shape import ModelShape, tensor_count_bound, tensor_numels
from dagrl.backends.pinned import ALIGN, pinned_bytes
from dagrl.backends.torch.lora import adapter_numels, adapter_params, merged_sync_bytes
from dagrl.backends.torch.mixed_precision import host_buffer_sizes
from dagrl.config.schema import LoraSync


def state_bytes(
    shape: ModelShape, width: int, trains: bool, optimizer_on_host: bool = False, lora=None
) -> dict[str, float]:
    """Weights, gradients and optimizer state on the device while the role runs; `lora` (the
    spec's LoraSettings): a frozen base and adapters in the compute dtype, which train as a
    full-parameter run's weights do (fp32 masters for bf16)."""
    adapters = adapter_params(shape, lora) if lora is not None else 0
    trained = adapters if lora is not None else shape.params
    parts = {"weights": float((shape.params + adapters) * width)}
    if not trains:
        return parts
    parts["grads"] = float(trained * width)
    if not optimizer_on_host:
        master = 4 if width < 4 else 0  # fp32 master weights for bf16/fp16 compute weights
        parts["optimizer"] = float(trained * (8 + master))
    return parts


def between_updates(state: dict[str, float], width: int, optimizer_on_host: bool) -> dict[str, float]:
    """What the role keeps outside its update: the compute-dtype gradients live only from the
    backward to the optimizer step when fp32 masters take them (bf16/fp16 weights, LoRA adapters
    included) or the step runs on the host (both free them as they are read: mixed_precision.py);
    fp32 AdamW on the weights themselves keeps them until the next update's zero_grad."""
    if width < 4 or optimizer_on_host:
        return {k: v for k, v in state.items() if k != "grads"}
    return dict(state)


def idle_bytes(state: dict[str, float], offload: bool) -> dict[str, float]:
    """What stays on the device while a colocated role has it (`state` as between_updates gives
    it): everything, or the gradients when the role offloads (weights and optimizer state wait in
    host memory)."""
    if not offload:
        return dict(state)
    return {k: v for k, v in state.items() if k == "grads"}


def layer_activation_bytes(shape: ModelShape, width: int) -> float:
    """Bytes one decoder layer saves for the backward, per token."""
    h, qkv, i = shape.hidden, shape.q_dim + shape.kv_dim, shape.intermediate
    return (8 + 4 * width) * h + (4 + 3 * width) * qkv + 4 * width * i


def update_bytes(
    shape: ModelShape, width: int, work: Workload, recompute: bool, logits: bool = True
) -> dict[str, float]:
    """Activations and logits of one micro-batch's forward + backward (`logits` False: a value
    head's update, no vocabulary).

    Without recomputation every layer's saved tensors live from the forward to the backward, the
    logits and their gradient with them. With it, the logits and their gradient exist at the start
    of the backward, before the first layer is recomputed, and are freed when the output layer's
    backward ends: the peak is every layer's input plus the larger of the two (measured on an H100,
    Qwen3-4B shape, 64 rows x 672 tokens: 37.7 GiB in use after the update, where counting both at
    once planned 49.3; docs/perf.md, session 10)."""
    layer = layer_activation_bytes(shape, width) * work.tokens
    out = 2 * width * work.rows * (work.response + 1) * shape.vocab if logits else 0  # + their gradient
    if recompute:
        activations = shape.layers * width * shape.hidden * work.tokens + max(0, layer - out)
    else:
        activations = shape.layers * layer
    return {"activations": float(activations), "logits": float(out)}


def one_backward_update(
    shape: ModelShape, width: int, work: Workload, recompute: bool, grads: float
) -> dict[str, float]:
    """The update's own parts when the optimizer step's gradients come from one backward and leave
    the device with the step (the step on the host; one micro-batch per step; no DDP bucket holding
    a copy): the backward makes them from the output layer down while it frees what the forward
    kept, so the peak is the larger of its start (update_bytes' activations and logits, and the
    output layer's weight gradient) and its end (every gradient and, recomputed, one layer's
    activations). Counting every gradient beside the logits planned 45.65 GiB above the weights
    for the Qwen3-8B shape (64 rows x 672 tokens); an H200 measured an allocator peak of 31.65 GiB
    above them, where the start counts 31.55 (2026-11-28); the Qwen3-4B shape's update on an H100
    read 38.81 GiB in use against 42.45 planned before, 35.68 now (session 20)."""
    update = update_bytes(shape, width, work, recompute)
    start = {**update, "grads": float(shape.vocab * shape.hidden * width)}
    layer = layer_activation_bytes(shape, width) * work.tokens if recompute else 0.0
    end = {"grads": grads, "activations": float(layer)}
    return start if parts_total(start) >= parts_total(end) else end


def forward_bytes(shape: ModelShape, width: int, work: Workload) -> dict[str, float]:
    """A no-grad forward (log-probs, a teacher): one layer's tensors live at a time and are gone
    before the output layer makes the logits, so the peak is the larger of the two (measured on an
    H100: 0.6B and 1.7B Qwen3 shapes, 64 rows x 640 tokens, within 3 %; docs/perf.md)."""
    layer = float(layer_activation_bytes(shape, width) * work.tokens)
    logits = float(width * work.rows * (work.response + 1) * shape.vocab)
    return {"logits": logits} if logits >= layer else {"activations": layer}


def communicators(trains: bool, workers: int) -> dict[str, float]:
    """The NCCL communicators a torch role's process makes (backends/communicators.py): a trained
    model on more than one worker is wrapped in DDP, which broadcasts it and all-reduces its
    gradients over the pool's default group; a forward-only one talks over none."""
    return {"world": GROUP_BYTES} if trains and workers > 1 else {}


def host_step_pinned_bytes(shape: ModelShape, width: int, lora=None) -> int:
    """Pinned host bytes of the host step's buffers (an fp32 gradient and a staging copy in the
    model's dtype per trained tensor), packed as MasterWeightsAdamW packs them. A model whose tensors
    tensor_numels cannot list gets a bound: whole items never fill a slab less than half."""
    numels = adapter_numels(shape, lora) if lora is not None else tensor_numels(shape)
    if numels is not None:
        return pinned_bytes(host_buffer_sizes(numels, width))
    trained = adapter_params(shape, lora) if lora is not None else shape.params
    return 2 * ((4 + width) * trained + 2 * ALIGN * tensor_count_bound(shape))


def offload_pinned_bytes(
    shape: ModelShape, width: int, optimizer: bool, lora=None, head: tuple[int, ...] = ()
) -> int:
    """Pinned host bytes an offload takes (HostStore's slabs, storages split at their ends): the
    weights (`head`: a critic's value head's tensors, trained), and with `optimizer` the fp32
    master (bf16/fp16 weights) and Adam's m and v of what trains. Split items cost their aligned
    bytes and less than one last small slab, so a model whose tensors cannot be listed is bounded
    by one alignment per tensor it may have."""
    base, adapters = tensor_numels(shape), adapter_numels(shape, lora) if lora is not None else []
    fp32_states = (3 if width < 4 else 2) if optimizer else 0  # per trained tensor
    if base is not None:
        trained = adapters if lora is not None else base + list(head)
        sizes = [width * n for n in base + list(head) + adapters] + [4 * n for n in trained] * fp32_states
        return pinned_bytes(sizes, split=True)
    trained = sum(adapters) if lora is not None else shape.params + sum(head)
    nbytes = width * (shape.params + sum(head) + sum(adapters)) + 4 * fp32_states * trained
    return pinned_bytes(
        [nbytes + ALIGN * (1 + fp32_states) * (tensor_count_bound(shape) + len(head))], split=True
    )


def role_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The torch backend's registered estimate: a role's footprint per device, per phase."""
    arr, width = cfg.actor_rollout_ref, param_width(spec.model.dtype)
    on_host = spec.trains and arr.actor.optimizer_cpu_offload  # the optimizer step on the host
    lora = spec.lora if spec.trains else None
    state = state_bytes(shape, width, spec.trains, on_host, lora)
    kept = between_updates(state, width, on_host)
    mem = RoleMemory(kept, idle_bytes(kept, spec.offload.params), stays=not spec.offload.params)
    mem.communicators = communicators(spec.trains, layout.workers)
    if on_host:  # pageable fp32 master, m, v of what trains (mixed_precision.MasterWeightsAdamW)
        trained = adapter_params(shape, lora) if lora is not None else shape.params
        mem.host = float(12 * trained + host_step_pinned_bytes(shape, width, lora))
    if spec.offload.params:  # what the hand-over moves to pinned slabs (host_store.HostStore)
        mem.host += float(offload_pinned_bytes(shape, width, spec.trains and not on_host, lora))
    for phase, work in forward_phases(cfg, spec, layout.dp).items():
        if phase == "teacher":  # chunked over the vocabulary: no whole logits
            mem.phases[phase] = teacher_forward_bytes(shape, width, work)
        else:
            mem.phases[phase] = forward_bytes(shape, width, work)
    if lora is not None and lora.sync == LoraSync.merged:  # the sync's merged weights
        bucket = arr.rollout.weight_sync_bucket_mb * 2.0**20
        mem.phases["weight_sync"] = {"merged": merged_sync_bytes(shape, lora, width, bucket)}
    if spec.trains:
        recompute = bool(arr.model.gradient_checkpointing)
        work = update_workload(cfg, layout.dp)
        transient = {k: v for k, v in state.items() if k not in kept}  # the gradients, made by the update
        if on_host and work.micro_batches == 1 and layout.dp == 1 and lora is None:
            mem.phases["update"] = one_backward_update(shape, width, work, recompute, transient["grads"])
        else:
            # accumulated over micro-batches, held by DDP's buckets, or upcast on the device into
            # the fp32 masters' gradients at the step (4 B a parameter beside them: this count
            # held within 2 % for the 1.7B and 4B shapes on an H200, sessions 22-24)
            mem.phases["update"] = transient | update_bytes(shape, width, work, recompute)
    return mem


def critic_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The torch critic's estimate (role critic): a trained model's state as the actor's (the
    trunk counted with its output layer: an overestimate by vocab × hidden weights), its values
    pass and its update without logits (a value head has no vocabulary), recomputed with
    critic.model.gradient_checkpointing."""
    width, update = param_width(spec.model.dtype), spec.train.update
    state = state_bytes(shape, width, trains=True)
    kept = between_updates(state, width, optimizer_on_host=False)
    mem = RoleMemory(kept, idle_bytes(kept, spec.offload.params), stays=not spec.offload.params)
    mem.communicators = communicators(True, layout.workers)
    if spec.offload.params:  # weights and optimizer state, in HostStore's pinned slabs
        mem.host = float(offload_pinned_bytes(shape, width, optimizer=True, head=(shape.hidden, 1)))
    forward = workload(cfg, spec.logprob_micro_batch_size, None, layout.dp)
    mem.phases[VALUES_PHASE] = {"activations": float(layer_activation_bytes(shape, width) * forward.tokens)}
    mini_rows = max(1, update.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // layout.dp)
    budget = update.ppo_max_token_len_per_gpu if update.use_dynamic_bsz else None
    work = workload(cfg, update.ppo_micro_batch_size_per_gpu, budget, layout.dp, mini_rows)
    recompute = update.model.gradient_checkpointing
    activations = update_bytes(shape, width, work, recompute, logits=False)["activations"]
    mem.phases[CRITIC_UPDATE_PHASE] = {k: v for k, v in state.items() if k not in kept} | {
        "activations": activations
    }
    return mem


def checkpoint_size(cfg, spec, layout) -> tuple[int, float]:
    """(bytes per weight, optimizer factor) of one checkpoint: HF weights once + every train rank's
    fp32 AdamW m and v (and fp32 master weights when the params are not fp32:
    backends/torch/mixed_precision.py)."""
    from dagrl.backends.hf_model import torch_dtype

    width = torch_dtype(cfg.actor_rollout_ref.model.dtype).itemsize
    per_rank = (8 + (0 if width == 4 else 4)) / width
    return width, per_rank * layout.workers if layout is not None else 0
