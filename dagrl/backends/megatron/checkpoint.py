"""Sharded checkpoints of the megatron backend through megatron-core's `dist_checkpointing`.

Layout of `path` (written by every rank together, `torch_dist` format):

    common.pt          rank 0: `extra`, the parallel layout, optimizer hyper-parameters
    *.distcp, .metadata  every rank's shards: model weights, the optimizer's fp32 main params
                       and Adam moments, and each rank's RNG state (a ShardedObject per rank)

Model tensors are stored under their global (unsharded) names and offsets, so the weights of a
checkpoint written with one TP / PP / VPP / DP layout load into any other. The distributed
optimizer's state has two formats (`OptimizerFormat`): DP_RESHARDABLE (megatron's default; its
per-bucket layout is written in parallel with no exchange, but only the DP size may change)
and FULLY_RESHARDABLE (per-parameter tensors, any layout change; saving gathers each TP/PP
shard's optimizer state onto its DP rank 0 over gloo, so it is slower and costs host memory).
megatron's third, `fully_sharded_model_space`, no longer saves in megatron-core 0.16.
The non-distributed optimizers are always per-parameter, hence fully reshardable.
RNG states only mean something for the same layout, so they are restored when the layout
matches and skipped (with a warning) otherwise.

megatron's `torch_dist` writer forks writer processes that need `psutil`; without it a save
hangs (the writer dies before reporting), so the `megatron` extra must install psutil.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import torch
from megatron.core import dist_checkpointing, tensor_parallel
from megatron.core import parallel_state as mpu
from megatron.core.dist_checkpointing import ShardedObject
from megatron.core.utils import unwrap_model

from dagrl.backends.train_common import host_rng_state, set_host_rng_state
from dagrl.errors import ConfigError

logger = logging.getLogger(__name__)


class OptimizerFormat(Enum):
    """How the distributed optimizer's state is laid out on disk (megatron's sharding types)."""

    DP_RESHARDABLE = "dp_reshardable"
    FULLY_RESHARDABLE = "fully_reshardable"


def _optimizer_metadata(fmt: OptimizerFormat) -> dict:
    return {
        "distrib_optim_sharding_type": fmt.value,
        # gather onto DP rank 0 over gloo (host memory) rather than all-gather on every GPU
        "distrib_optim_fully_reshardable_mem_efficient": True,
        # tensor keys independent of how many optimizers megatron chains (dense / MoE experts)
        "chained_optim_avoid_prefix": True,
    }


@dataclass(frozen=True)
class CheckpointLayout:
    """The parallel layout a checkpoint was written with; RNG states are per rank of it."""

    world: int
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    dp: int

    @classmethod
    def current(cls) -> CheckpointLayout:
        return cls(
            world=torch.distributed.get_world_size(),
            tp=mpu.get_tensor_model_parallel_world_size(),
            pp=mpu.get_pipeline_model_parallel_world_size(),
            vpp=mpu.get_virtual_pipeline_model_parallel_world_size(),
            cp=mpu.get_context_parallel_world_size(),
            ep=mpu.get_expert_model_parallel_world_size(),
            dp=mpu.get_data_parallel_world_size(),
        )


def save(
    path: str,
    model: list[torch.nn.Module],
    optimizer: Any | None,
    extra: dict,
    optimizer_format: OptimizerFormat = OptimizerFormat.DP_RESHARDABLE,
    keep: Callable[[str], bool] | None = None,
) -> None:
    """Write the model chunks, the optimizer, `extra` and every rank's RNG state under `path`.

    Collective: every rank calls it. `path` must exist (the trainer creates it); nothing is
    written outside it, and all ranks have finished writing when any rank returns.
    `model` is the chunk list as trained (DDP / Float16Module wrappers are looked through);
    `optimizer` is megatron's (None for a forward-only model); `extra` is plain picklable data,
    identical on every rank (rank 0's copy is stored). `keep(key)`, when given, picks the model
    tensors written (LoRA: the adapters; the frozen base is model.path's).
    """
    layout = CheckpointLayout.current()
    state = _sharded_state(model, optimizer, optimizer_format, is_loading=False, keep=keep)
    state["extra"] = extra
    state["layout"] = asdict(layout)
    state["optimizer_format"] = optimizer_format.value
    state["rng_state"] = _rng_object(layout, _rng_state())
    dist_checkpointing.save(state, path)
    # dist_checkpointing ends with a barrier already; keep ours so the contract does not
    # depend on that implementation detail (the trainer renames `path` right after)
    torch.distributed.barrier()


def load(
    path: str, model: list[torch.nn.Module], optimizer: Any | None, keep: Callable[[str], bool] | None = None
) -> dict:
    """Restore what `save` wrote into `model` and `optimizer` in place; returns `extra`.

    Collective. Weights load into any TP / PP / VPP / DP layout; the optimizer state into
    what its `OptimizerFormat` allows; RNG states only into the same layout.
    Loading with optimizer=None (a reference model) ignores the stored optimizer state.
    `keep`: as save's; the other model tensors stay as they are.
    """
    common = dist_checkpointing.load_common_state_dict(path)
    saved, layout = CheckpointLayout(**common["layout"]), CheckpointLayout.current()
    fmt = OptimizerFormat(common["optimizer_format"])
    _check_reshardable(path, saved, layout, fmt, optimizer)
    state = _sharded_state(model, optimizer, fmt, is_loading=True, keep=keep)
    if saved == layout:
        state["rng_state"] = _rng_object(layout, None)
    elif torch.distributed.get_rank() == 0:
        logger.warning("%s: resharding %s into %s; RNG states are not restored", path, saved, layout)
    loaded = dist_checkpointing.load(state, path)
    for i, chunk in enumerate(unwrap_model(model)):
        result = chunk.load_state_dict(loaded[f"model{i}"], strict=keep is None)
        assert not any(keep(k) for k in getattr(result, "missing_keys", ())), f"{path}: {result}"
        assert not getattr(result, "unexpected_keys", ()), f"{path}: {result}"
    if optimizer is not None:
        _load_optimizer(optimizer, loaded["optimizer"])
    if saved == layout:
        _set_rng_state(loaded["rng_state"])
    torch.distributed.barrier()
    return common["extra"]


def _check_reshardable(
    path: str, saved: CheckpointLayout, layout: CheckpointLayout, fmt: OptimizerFormat, optimizer: Any | None
) -> None:
    model_axes = ("tp", "pp", "vpp", "cp", "ep")
    if optimizer is None or fmt != OptimizerFormat.DP_RESHARDABLE or not _is_distributed(optimizer):
        return
    if any(getattr(saved, a) != getattr(layout, a) for a in model_axes):
        raise ConfigError(
            "trainer.resume_mode",
            path,
            f"this checkpoint's optimizer state was saved for {saved} and can only change the DP "
            f"size, not load into {layout}: resume with the saved TP/PP/VPP/CP/EP sizes (or save "
            "with OptimizerFormat.FULLY_RESHARDABLE)",
        )


def _is_distributed(optimizer: Any) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    return any(isinstance(o, DistributedOptimizer) for o in inner)


def _sharded_state(
    model: list[torch.nn.Module],
    optimizer: Any | None,
    fmt: OptimizerFormat,
    is_loading: bool,
    keep: Callable[[str], bool] | None = None,
) -> dict:
    """{"model0": ..., "model1": ..., "optimizer": ...}: one entry per (virtual pipeline) chunk.

    Chunks are separate dicts, not key prefixes: their tensors already carry global layer
    numbers, so a VPP checkpoint and a non-VPP one name the same weights the same way.
    """
    state: dict[str, Any] = {
        f"model{i}": {k: v for k, v in chunk.sharded_state_dict().items() if keep is None or keep(k)}
        for i, chunk in enumerate(unwrap_model(model))
    }
    if optimizer is not None:
        if is_loading:
            _prime_adam_state(optimizer)
        merged: dict[str, Any] = {}
        for i in range(len(model)):
            merged.update(state[f"model{i}"])
        state["optimizer"] = optimizer.sharded_state_dict(
            merged, is_loading=is_loading, metadata=_optimizer_metadata(fmt)
        )
    return state


def _prime_adam_state(optimizer: Any) -> None:
    """Give a fresh torch Adam state tensors (zeros, step 0) so megatron can describe it.

    megatron's DistributedOptimizer.state_dict() reads each parameter's "step" when neither
    Apex nor TransformerEngine is installed, and torch's Adam creates its state only on the
    first step: a never-stepped optimizer cannot be loaded into. The CPU optimizer
    (megatron.optimizer_cpu_offload: HybridDeviceOptimizer) is no exception: its state is its
    torch AdamW sub-optimizers', empty until a step, so those are primed and the state handed up
    (megatron's own load path would take a step with random gradients instead, and it is
    reached only after state_dict() has failed). Everything primed here is overwritten by the load.
    """
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(o, "optimizer", None)
        if isinstance(inner, HybridDeviceOptimizer) and len(inner.state) == 0:
            for sub in inner.sub_optimizers:
                _prime_torch_adam(sub)
            inner._sync_sub_optimizers_state_to_hdo()
        elif isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            _prime_torch_adam(inner)


def _prime_torch_adam(inner: torch.optim.Optimizer) -> None:
    if len(inner.state) > 0:
        return
    for group in inner.param_groups:
        for p in group["params"]:
            inner.state[p] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


def _load_optimizer(optimizer: Any, state: dict) -> None:
    """optimizer.load_state_dict, except for DistributedOptimizer over torch's Adam (no Apex/TE).

    There megatron (0.16) mishandles Adam's per-parameter "step" tensor: loading the parameter
    state copies the stale pre-load steps back (dp_reshardable) or fails on the missing key
    (fully_reshardable), and the steps it sets share one tensor, which foreach Adam would then
    advance once per parameter. So the step-free part is loaded with "step" set aside and
    each parameter gets its own step tensor from the param groups afterwards. Over the CPU
    optimizer (HybridDeviceOptimizer) megatron's load runs and `_settle_hybrid` mends it.
    """
    chain = getattr(optimizer, "chained_optimizers", [optimizer])
    if not any(_is_torch_adam_distributed(o) or _is_hybrid_distributed(o) for o in chain):
        with torch.no_grad():  # fp32 main params are views of grad-requiring model params
            optimizer.load_state_dict(state)
        return
    states = [state] if len(chain) == 1 else [state[i] for i in range(len(chain))]
    for o, sd in zip(chain, states):
        with torch.no_grad():
            if _is_torch_adam_distributed(o):
                _load_torch_adam_distributed(o, sd)
            else:
                o.load_state_dict(sd)
                if _is_hybrid_distributed(o):
                    _settle_hybrid(o.optimizer)
    if len(chain) > 1:
        optimizer._synchronize_steps()  # what ChainedOptimizer.load_state_dict ends with


def _is_torch_adam_distributed(o: Any) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return isinstance(o, DistributedOptimizer) and isinstance(
        o.optimizer, torch.optim.Adam | torch.optim.AdamW
    )


def _is_hybrid_distributed(o: Any) -> bool:
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return isinstance(o, DistributedOptimizer) and isinstance(o.optimizer, HybridDeviceOptimizer)


def _settle_hybrid(hdo: Any) -> None:
    """Finish megatron's load into the CPU optimizer (HybridDeviceOptimizer) as a step expects it.

    megatron-core 0.16.1 without Apex/TE gives every parameter's state one shared "step" tensor
    (over dp_reshardable, the never-stepped optimizer's 0), which the per-parameter CPU AdamWs
    would each advance: the resumed step did not continue the saved run (the GPU test of
    tests_b1 saw it). Each parameter gets its own step, the saved count from the param groups.
    Then the state is handed to the sub-optimizers and the loaded fp32 masters are written into
    the tensors they step, the state pointing at those again as after a step: what megatron's
    other load paths call `_sync_hdo_state_to_sub_optimizers` for, which fails when the masters
    stay on the device (no 16-bit parameter has an fp32 copy there). With the masters on the
    host the stepped tensors already hold the loaded values over dp_reshardable (the load is in
    place); with them on the device the host copies were taken from the params before the load."""
    _own_steps(hdo)
    for sub in hdo.sub_optimizers:  # each steps the state of its own (inner) parameters
        inner = [q for g in sub.param_groups for q in g["params"]]
        sub.state = defaultdict(dict, {q: hdo.state[hdo.inner_param_to_orig_param[q]] for q in inner})
    hdo._move_new_state_to_right_device()  # the host's sub-optimizers' state on the host
    for param, stepped in hdo.param_to_inner_param.items():
        if stepped is param:  # stepped in place: the load wrote it
            continue
        state = hdo.state[param]
        master = state.get("master_param") if param in hdo.param_to_fp32_param else None
        stepped.copy_(param if master is None else master)
        if master is not None:
            state["master_param"] = stepped


def _load_torch_adam_distributed(o: Any, state: dict) -> None:
    state = dict(state)
    param_state, kind = state.pop("param_state"), OptimizerFormat(state.pop("param_state_sharding_type"))
    o.load_state_dict(state)  # hyper-parameters, grad scaler, and the step into the param groups
    inner = o.optimizer
    for s in inner.state.values():
        s.pop("step", None)
    if kind == OptimizerFormat.DP_RESHARDABLE:
        o.load_parameter_state_from_dp_reshardable(param_state)
    else:
        o.load_parameter_state_from_fully_reshardable(param_state)
    _own_steps(inner)


def _own_steps(inner: Any) -> None:
    """Each parameter's state its own step tensor at its param group's (the saved) step count."""
    for group in inner.param_groups:
        if group.get("step") is None:  # Apex/TE optimizers keep the step in the group alone
            continue
        for p in group["params"]:
            inner.state[p]["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)


def _rng_object(layout: CheckpointLayout, rng_state: dict | None) -> ShardedObject:
    """This rank's slot of a [world] array of RNG states (None: a placeholder to load into)."""
    rank = torch.distributed.get_rank()
    return ShardedObject("rng_state", rng_state, (layout.world,), (rank,), replica_id=0)


def _rng_state() -> dict:
    state = {
        **host_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": None,
    }
    tracker = tensor_parallel.get_cuda_rng_tracker()
    if getattr(tracker, "is_initialized", lambda: True)():
        # megatron's TP-aware dropout/init streams (model-parallel-rng); absent when unseeded
        state["tracker"] = {k: v.clone() for k, v in tracker.get_states().items()}
    return state


def _set_rng_state(state: dict) -> None:
    set_host_rng_state(state)
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if state["tracker"] is not None:
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
