"""Memory of the megatron train backend per device, in bytes (pure: no megatron import).

State: dense weights split over TP×PP, expert weights over expert-TP×EP×PP, in param_dtype (under
PP the layers split evenly and the first stage adds the embedding, the last the output layer, a copy
of the embedding when they are tied: a vocabulary matrix on each end, the device planned is the
end stage's); fp32
gradient buffers (grad_reduce_in_fp32); Adam's m and v in fp32 plus fp32 master weights (unless
the params are fp32), split over the data-parallel ranks by the distributed optimizer. With
optimizer_cpu_offload a share (optimizer_offload_fraction) of that state and its step live on the
host, counted per tensor as megatron lays them out (optimizer_host.py: pinned gradients rounded up
to powers of two). param_offload / optimizer_offload move their part to host memory while a colocated role
has the device, and grad_offload (on unless pinned false) frees the gradient buffers then; the role's own phases have everything back.

Activations per token per layer (TE or sdpa layer spec, flash attention, w = bytes of
param_dtype): the two norms' inputs and outputs 4w·h, q/k/v and their rotary copies
w·(2q + 3kv) (+ w·(q + kv) for the q/k norms' inputs), the attention output w·q, the MLP's gate/up
output, silu(gate) and their product 4w·i (fitted on an H100, docs/perf.md), and two
dropout masks 2h (one byte each; Qwen's dropout is 0 but the masks are made). Tensor parallel
splits the attention and MLP parts, sequence parallel the rest too; context parallel splits the
tokens. Full recompute keeps each recomputed layer's input (w·h) plus one layer at a time.
1F1B keeps up to PP micro-batches in flight on the first stage: L/PP layers × min(PP, micro-batches);
the last stage keeps one micro-batch's layers and makes the logits, [S, B, V/TP] in param_dtype over
every position, whose gradient the update adds. A PP device is planned as the larger of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dagrl.backends.communicators import GROUP_BYTES, PAIR_BYTES, group_bytes
from dagrl.backends.megatron.optimizer_host import bounded_host_bytes, largest_tensor, listed_host_bytes
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
from dagrl.backends.model_shape import ModelShape, tensor_count_bound
from dagrl.backends.pinned import ALIGN, pinned_bytes


@dataclass(frozen=True)
class MegatronLayout:
    """A megatron role's parallel sizes on its devices."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1
    workers: int = 1
    sequence_parallel: bool = False


def precision_aware(m) -> bool:
    """megatron.use_precision_aware_optimizer resolved: null = on with the CPU optimizer and the
    distributed optimizer (the fp32 masters then live in the CPU optimizer only)."""
    if m.use_precision_aware_optimizer is not None:
        return m.use_precision_aware_optimizer
    return bool(m.optimizer_cpu_offload) and m.use_distributed_optimizer


def offload_fraction(m) -> float:
    """megatron.optimizer_offload_fraction resolved: null (auto, before the plan chooses) = 1.0."""
    return 1.0 if m.optimizer_offload_fraction is None else m.optimizer_offload_fraction


def state_bytes(
    shape: ModelShape,
    layout: MegatronLayout,
    param_dtype,
    trains: bool,
    distributed_optimizer: bool,
    optimizer_host_fraction: float = 0.0,
    masters_on_host: bool = True,
    stage: int | None = None,
) -> tuple[dict[str, float], float]:
    """(weights, grads, optimizer bytes on the device while the role runs; bytes the CPU
    optimizer keeps on the host: per offloaded parameter an fp32 master, its pinned fp32 gradient
    and Adam's m and v, each pinned block a power of two: cpu_optimizer_host). Without
    `masters_on_host` (precision-aware off) the distributed optimizer keeps its fp32 main params on
    the device beside the CPU optimizer's copy: 4 bytes per offloaded parameter more on the device.
    `stage`: that pipeline stage's (None: the largest's)."""
    local_dense, local_experts = stage_params(shape, layout, stage)
    width = param_width(param_dtype)
    parts = {"weights": (local_dense + local_experts) * width}
    if not trains:
        return parts, 0.0
    parts["grads"] = (local_dense + local_experts) * 4.0
    adam = 8 + (0 if width == 4 else 4)  # m, v (+ fp32 master weights)
    if distributed_optimizer:  # shards over DP×CP, experts over the expert-data-parallel ranks
        local_dense /= layout.dp * layout.cp
        local_experts /= max(1, layout.workers // (layout.etp * layout.ep * layout.pp))
    optimizer = adam * (local_dense + local_experts)
    parts["optimizer"] = optimizer * (1 - optimizer_host_fraction)
    if optimizer_host_fraction and not masters_on_host and width != 4:
        parts["main_params"] = 4.0 * (local_dense + local_experts) * optimizer_host_fraction
    if not optimizer_host_fraction:
        return parts, 0.0
    assert distributed_optimizer, (
        "megatron's CPU optimizer runs in the distributed optimizer (precision_rules.py)"
    )
    return parts, cpu_optimizer_host(shape, layout, width, optimizer_host_fraction, masters_on_host, stage)


def cpu_optimizer_host(
    shape: ModelShape,
    layout: MegatronLayout,
    width: int,
    fraction: float,
    masters_on_host: bool,
    stage: int | None = None,
    value_head: bool = False,
) -> float:
    """Host bytes of megatron's CPU optimizer on one device (optimizer_host.py), which runs inside
    the distributed optimizer (precision_rules.py): its pinned blocks and pageable fp32 state for
    the tensors megatron lays out, on the DP rank and pipeline stage (`stage`; None: whichever)
    that hold the most; where they cannot be listed (MoE), a bound over the device's offloaded
    elements. `value_head`: the critic's trunk and head (`shape` the model's)."""
    if not fraction:
        return 0.0
    shards = layout.dp * layout.cp
    listed = listed_host_bytes(
        shape, width, layout.tp, layout.pp, shards, fraction, masters_on_host, stage, value_head
    )
    if listed is not None:
        return float(sum(listed))
    if value_head:
        shape = critic_trunk(shape)
    dense, experts = stage_params(shape, layout, stage)
    expert_shards = max(1, layout.workers // (layout.etp * layout.ep * layout.pp))
    elements = dense / shards + experts / expert_shards
    largest = largest_tensor(shape, layout.tp, layout.ep, layout.etp)
    sharded = shards > 1 or expert_shards > 1
    pinned, pageable = bounded_host_bytes(
        fraction * elements, fraction * (dense + experts), largest, width, masters_on_host, sharded
    )
    return pinned + pageable


def critic_trunk(shape: ModelShape) -> ModelShape:
    """The megatron critic's parameters: the model's without its vocabulary output layer (a tied
    embedding stays), with a [hidden, 1] head and its bias."""
    out = 0 if shape.tied else shape.vocab * shape.hidden
    return replace(shape, params=shape.params - out + shape.hidden + 1)


def stage_params(shape: ModelShape, layout: MegatronLayout, stage: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters on one device of pipeline stage `stage` (None: the largest, an
    end stage). Megatron splits the layers evenly over PP; the first stage also holds the embedding
    and the last the output layer, which for a tied model is a copy of the embedding (megatron
    keeps both ends in step by an all-reduce of their gradients): under PP each end stage holds one
    vocabulary matrix, a middle stage none."""
    dense, experts = shape.params - shape.expert_params, shape.expert_params
    if layout.pp > 1:
        vocab = shape.vocab * shape.hidden
        ends = stage is None or stage in (0, layout.pp - 1)
        dense = (dense - vocab * (1 if shape.tied else 2)) / layout.pp + (vocab if ends else 0)
    return dense / layout.tp, experts / (layout.etp * layout.ep * layout.pp)


def lora_state_bytes(
    shape: ModelShape, layout: MegatronLayout, param_dtype, lora, distributed_optimizer: bool
):
    """A LoRA actor's state (lora.py): the frozen base in param_dtype (no gradient, no master, no
    Adam state), the adapters in param_dtype with an fp32 main gradient, and Adam's m, v plus an
    fp32 main param when param_dtype is 16-bit (sharded over DP×CP by the distributed optimizer)."""
    from dagrl.backends.megatron.lora import adapter_params

    parts, _ = state_bytes(shape, layout, param_dtype, False, distributed_optimizer)
    adapters = adapter_params(shape, lora, layout.tp) / layout.pp
    width = param_width(param_dtype)
    parts["weights"] += width * adapters  # offloaded with the base
    parts["grads"] = 4.0 * adapters
    main = 4.0 if width < 4 else 0.0
    parts["optimizer"] = (8.0 + main) * adapters / (layout.dp * layout.cp if distributed_optimizer else 1)
    return parts


def idle_bytes(state: dict[str, float], params: bool, grads: bool, optimizer: bool) -> dict[str, float]:
    """What stays on the device while a colocated role has it, given the three offload flags."""
    gone = {"weights": params, "grads": grads, "optimizer": optimizer}
    return {k: v for k, v in state.items() if not gone.get(k, False)}


def layer_activation_bytes(shape: ModelShape, width: int, layout: MegatronLayout) -> float:
    """Bytes one transformer layer saves for the backward, per token of the micro-batch."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    qk_norm = q + kv if shape.qk_norm else 0  # the q/k norms' inputs (Qwen3)
    # attention, the MLP (fc1's gate/up output, silu(gate), their product: 4i without TE's fused
    # SwiGLU), their inputs
    split = width * (2 * q + 3 * kv + qk_norm + q + 4 * i + 2 * h) / layout.tp
    replicated = 2 * width * h + 2 * h  # norm inputs, dropout masks: split by sequence parallel only
    if layout.sequence_parallel:
        replicated /= layout.tp
    return (split + replicated) / layout.cp


def update_stages(
    shape: ModelShape,
    width: int,
    layout: MegatronLayout,
    work: Workload,
    recompute_layers: int = 0,
    logits: bool = True,
) -> list[dict[str, float]]:
    """Activations and logits of the update's forward + backward on each pipeline stage, first to
    last (one stage without PP); `recompute_layers`: layers per stage under full recompute (0 =
    none); `logits` False: a value head's update, no vocabulary.

    1F1B runs PP - s - 1 warm-up forwards on stage s before its first backward: it keeps
    min(PP - s, micro-batches) micro-batches of its layers; only the last stage makes the logits.
    The logits over every position and their gradient (the log-prob kernel's backward writes it
    beside the saved logits) exist at the start of the backward and are freed when the output
    layer's backward ends, before the first layer is recomputed: under recompute the last stage's
    peak holds every kept input plus the larger of the two, as the torch backend's update_bytes
    (an earlier stage's, one recomputed layer on top). Measured on an H200 (Qwen3-8B shape, LoRA,
    one micro-batch of 64 rows, 33.4k tokens, expandable allocator segments): the allocator's peak
    above the update's start was 28.3 GiB; the kept inputs plus logits and gradient at those tokens
    make 28.1 (docs/gpu_acceptance.md, session 21)."""
    stage_layers = shape.layers / layout.pp
    layer = layer_activation_bytes(shape, width, layout) * work.tokens
    recomputed = min(recompute_layers, stage_layers)
    kept_input = (
        width * shape.hidden * work.tokens / layout.cp / (layout.tp if layout.sequence_parallel else 1)
    )
    per_micro = (stage_layers - recomputed) * layer + recomputed * kept_input
    out = 2 * width * work.tokens / layout.cp * shape.vocab / layout.tp if logits else 0.0
    last = {
        "activations": float(per_micro + (max(0.0, layer - out) if recomputed else 0.0)),
        "logits": float(out),
    }
    earlier = [
        {
            "activations": float(
                per_micro * min(layout.pp - s, work.micro_batches) + (layer if recomputed else 0.0)
            )
        }
        for s in range(layout.pp - 1)
    ]
    return [*earlier, last]


def largest(stages: list[dict[str, float]]) -> dict[str, float]:
    """The stage whose parts weigh the most: what every device of the role is planned for."""
    return max(stages, key=parts_total)


def forward_bytes(shape: ModelShape, width: int, layout: MegatronLayout, work: Workload) -> dict[str, float]:
    """A forward-only pass: one layer's tensors at a time, gone before the output layer makes the
    logits over every position; the peak is the larger of the two."""
    layer = float(layer_activation_bytes(shape, width, layout) * work.tokens)
    logits = float(width * work.tokens / layout.cp * shape.vocab / layout.tp)
    return {"logits": logits} if logits >= layer else {"activations": layer}


def stays(spec) -> bool:
    """Whether the role's hand-over moves nothing (train.py / critic.py: offload returns False)."""
    o = spec.offload
    return not (o.params or (spec.trains and (o.grads or o.optimizer)))


def communicators(
    layout: MegatronLayout, trains: bool, tied: bool, distributed_optimizer: bool
) -> dict[str, float]:
    """The NCCL communicators a megatron role's process makes (backends/communicators.py): those of
    the groups megatron-core 0.16.1 talks over in a step, as traced on the CPU under gloo (TP2,
    TP2+SP, PP2, DP2 in tests/backends/megatron/test_comm_groups.py; TP2xPP2 and TP2xDP2 on four
    ranks once, by hand):
    - training: the default group (the optimizer's build gathers its parameter keys over it), the
      data-parallel group (its gradients and, with the distributed optimizer, the parameters'
      all-gather: a group of one rank at DP 1), the gradient norm's group (with the distributed
      optimizer every rank of the instance, a group of its own; without it the model-parallel ranks);
    - TP: the tensor-parallel group (layers, sequence parallel, log-probs, the weight export);
    - PP: the stages' sends and receives, the pipeline group's collectives (the weight export, when
      training) and, for a tied model, the embedding group (both ends' copies kept in step).
    A forward-only role (the reference, a teacher) makes only its TP and PP ones; colocated with the
    actor it shares megatron's groups, so the names agree. Read, not traced (no CPU path runs
    them): CP's group (TransformerEngine's attention), EP's token exchange and the experts'
    data-parallel group; the other expert groups are not counted. One worker: none (the groups are
    all of one rank: backends/communicators.py)."""
    if layout.workers == 1:
        return {}
    made = {}
    if trains:
        made["world"] = GROUP_BYTES
        made["megatron dp"] = group_bytes(layout.dp * layout.cp)
        norm_ranks = layout.workers if distributed_optimizer else layout.tp * layout.pp
        made["megatron grad norm"] = group_bytes(norm_ranks)
    if layout.tp > 1:
        made["megatron tp"] = GROUP_BYTES
    if layout.pp > 1:
        # megatron batches a step's sends and receives (batch_p2p_comm), which torch runs on the
        # pipeline group's communicator, adding NCCL's point-to-point buffers to it; counted as the
        # probe's send/recv pair (its own communicator there: high by a communicator's base, if
        # anything); a middle stage talks to two neighbours
        made["megatron pp send/recv"] = PAIR_BYTES * (1 if layout.pp == 2 else 2)
        if trains:
            made["megatron pp"] = GROUP_BYTES
        if tied:
            made["megatron embedding"] = GROUP_BYTES
    if layout.cp > 1:
        made["megatron cp"] = GROUP_BYTES
    if layout.ep > 1:
        made["megatron ep"] = GROUP_BYTES
        made["megatron expert dp"] = group_bytes(layout.workers // (layout.etp * layout.ep * layout.pp))
    return made


def host_bytes(
    state: dict[str, float], idle: dict[str, float], shape: ModelShape, layout: MegatronLayout, width: int
) -> float:
    """What offload keeps in host memory of `state` (`idle`: what stays on the device): the
    optimizer state as megatron's offload_to_cpu copies it, and the weights in HostStore's pinned
    slabs (backends/pinned.py, storages split at slab ends: their aligned bytes and less than one
    last small slab). Their storages follow megatron-core 0.16.1's _ParamAndGradBuffer
    (distributed/param_and_grad_buffer.py): under the distributed optimizer one contiguous buffer
    per dtype and kind (dense, expert) of a model chunk, each parameter starting on 64 elements
    and the bucket padded to lcm(DP·CP, 128) elements; otherwise (and for frozen weights) one
    storage per tensor. Exact sizes need megatron's parameter list: bounded by one alignment and
    one bucket's padding per tensor the stage may have (tensor_count_bound; a few MiB at 8B). The
    gradient buffers are freed, not copied: the next update zeroes them."""
    moved = {k: v for k, v in state.items() if k not in idle and k != "grads"}
    if "weights" not in moved:
        return parts_total(moved)
    padding = ALIGN + math.lcm(layout.dp * layout.cp, 128) * width
    weights = pinned_bytes([int(moved.pop("weights")) + padding * tensor_count_bound(shape)], split=True)
    return parts_total(moved) + weights


def role_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The megatron backend's registered estimate: a role's footprint per device, per phase."""
    m = spec.megatron
    mlayout = MegatronLayout(
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        dp=layout.dp,
        ep=m.expert_model_parallel_size,
        etp=m.expert_tensor_parallel_size or layout.tp,
        workers=layout.workers,
        sequence_parallel=m.sequence_parallel,
    )
    fraction = offload_fraction(m) if m.optimizer_cpu_offload else 0.0  # on the host
    state, host = state_bytes(
        shape, mlayout, m.param_dtype, spec.trains, m.use_distributed_optimizer, fraction, precision_aware(m)
    )
    if spec.trains and spec.lora is not None:
        state, host = (
            lora_state_bytes(shape, mlayout, m.param_dtype, spec.lora, m.use_distributed_optimizer),
            0.0,
        )
    idle = idle_bytes(state, spec.offload.params, spec.offload.grads, spec.offload.optimizer)
    width = param_width(m.param_dtype)
    # host: the CPU optimizer's state, and what offload copies there while another role runs
    mem = RoleMemory(
        state,
        idle,
        host=host + host_bytes(state, idle, shape, mlayout, width),
        stays=stays(spec),
    )
    mem.communicators = communicators(mlayout, spec.trains, shape.tied, m.use_distributed_optimizer)
    for phase, work in forward_phases(cfg, spec, layout.dp).items():
        if phase == "teacher":  # chunked over the vocabulary shard: no whole logits
            mem.phases[phase] = teacher_forward_bytes(shape, width, work, mlayout.tp, mlayout.cp)
        else:
            mem.phases[phase] = forward_bytes(shape, width, mlayout, work)
    if spec.trains:
        work = update_workload(cfg, layout.dp)
        stages = update_stages(shape, width, mlayout, work, recompute_layers(m, shape))
        mem.phases["update"] = largest(stages)
        if mlayout.pp > 1 and spec.lora is None:  # the stages differ: the plan prints each
            states = [
                state_bytes(shape, mlayout, m.param_dtype, True, m.use_distributed_optimizer, fraction,
                            precision_aware(m), stage=s)[0]
                for s in range(mlayout.pp)
            ]  # fmt: skip
            mem.stages["update"] = [{**state, **own} for state, own in zip(states, stages)]
    return mem


def recompute_layers(m, shape: ModelShape) -> int:
    """Layers per pipeline stage whose activations megatron recomputes (full recompute only;
    selective recompute saves the attention scores, which flash attention never keeps)."""
    if getattr(m.recompute_granularity, "value", m.recompute_granularity) != "full":
        return 0
    stage = shape.layers // m.pipeline_model_parallel_size
    if getattr(m.recompute_method, "value", m.recompute_method) == "block":
        return min(stage, m.recompute_num_layers or stage)
    return stage


def checkpoint_size(cfg, spec, layout) -> tuple[int, float]:
    """(bytes per weight, optimizer factor) of one checkpoint: weights in param_dtype + fp32 m, v
    (and fp32 master weights when the params are not fp32), stored once (dist_checkpointing
    deduplicates replicas); the role's own megatron section (the critic's is critic.megatron)."""
    m = getattr(spec, "megatron", None) or cfg.actor_rollout_ref.actor.megatron
    width = 4 if m.param_dtype == "float32" else 2
    return width, (8 + (0 if width == 4 else 4)) / width


def critic_memory(cfg, spec, layout, shape: ModelShape, card: float, colocated: int) -> RoleMemory:
    """The megatron critic's estimate (role critic, critic.megatron.*): the trunk without its
    vocabulary output layer plus a [hidden, 1] head, trained as the actor's state is; its values
    pass one layer's activations at a time and its update the layers' (no logits: the head's
    [S, B, 1] output is nothing beside them)."""
    from dagrl.backends.megatron.critic_rules import critic_megatron

    m, update = critic_megatron(spec), spec.train.update
    model, shape = shape, critic_trunk(shape)
    mlayout = MegatronLayout(
        tp=layout.tp,
        dp=layout.dp,
        ep=m.expert_model_parallel_size,
        etp=m.expert_tensor_parallel_size or layout.tp,
        workers=layout.workers,
        sequence_parallel=m.sequence_parallel,
    )
    fraction = offload_fraction(m) if m.optimizer_cpu_offload else 0.0
    state, _ = state_bytes(
        shape, mlayout, m.param_dtype, True, m.use_distributed_optimizer, fraction, precision_aware(m)
    )
    idle = idle_bytes(state, spec.offload.params, spec.offload.grads, spec.offload.optimizer)
    width = param_width(m.param_dtype)
    # the CPU optimizer's tensors are the model's with the head for the output layer
    host = cpu_optimizer_host(model, mlayout, width, fraction, precision_aware(m), value_head=True)
    # host, as the actor's: what offload copies there
    mem = RoleMemory(
        state,
        idle,
        host=host + host_bytes(state, idle, shape, mlayout, width),
        stays=stays(spec),
    )
    mem.communicators = communicators(mlayout, True, shape.tied, m.use_distributed_optimizer)
    forward = workload(cfg, spec.logprob_micro_batch_size, None, layout.dp)
    mem.phases[VALUES_PHASE] = {
        "activations": float(layer_activation_bytes(shape, width, mlayout) * forward.tokens)
    }
    mini_rows = max(1, update.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // layout.dp)
    budget = update.ppo_max_token_len_per_gpu if update.use_dynamic_bsz else None
    work = workload(cfg, update.ppo_micro_batch_size_per_gpu, budget, layout.dp, mini_rows)
    (phase,) = update_stages(shape, width, mlayout, work, recompute_layers(m, shape), logits=False)
    mem.phases[CRITIC_UPDATE_PHASE] = {"activations": phase["activations"]}
    return mem
