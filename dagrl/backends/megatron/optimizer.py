"""megatron-core's optimizer as the actor's settings ask for it: mixed precision and CPU offload.

Mixed precision is megatron's own: with bf16/fp16 params (`bf16=True` / `fp16=True`) the optimizer
keeps fp32 main params and fp32 Adam moments; gradients accumulate in fp32 main-grad buffers
(`grad_reduce_in_fp32`). Bytes per parameter on the device, bf16, one DP rank: 2 weights + 4 grads
+ 4 master + 8 Adam = 18 (the distributed optimizer divides the last 12 by the DP size).

`megatron.optimizer_cpu_offload` selects megatron-core's HybridDeviceOptimizer: the Adam moments of
`optimizer_offload_fraction` of the parameters (and their fp32 step) live in host memory (pageable;
the gradients' host copies are pinned) and step on the CPU (torch's fused CPU AdamW); gradients
are copied D2H and updated weights H2D each step (`overlap_cpu_optimizer_d2h_h2d` overlaps the
copies with the CPU step on side streams). Without `use_precision_aware_optimizer` the distributed optimizer still keeps its fp32
main params on the device (device: 2 + 4 + 4 = 10 bytes per parameter); with it the fp32 masters
live on the host only (device: 6). Host: per offloaded parameter an fp32 master, m and v (12
pageable bytes) and the pinned fp32 gradient, each pinned block rounded up to a power of two
(optimizer_host.py: 17.6-18.3 bytes a parameter at the Qwen3 shapes).
"""

from __future__ import annotations

import torch

from dagrl.backends.megatron.memory import offload_fraction
from dagrl.backends.megatron.memory import precision_aware as resolved_precision_aware
from dagrl.backends.megatron.probes import transformer_engine_available
from dagrl.config.schema import ActorConfig, MegatronConfig


def optimizer_config(actor: ActorConfig, m: MegatronConfig, dtype: torch.dtype):
    """megatron-core's OptimizerConfig for the actor: AdamW, actor.grad_clip, mixed precision by the
    params' dtype, and the CPU offload knobs of actor.megatron (backends/megatron/precision_rules.py checks them)."""
    from megatron.core.optimizer import OptimizerConfig

    o = actor.optim
    offload = {}
    if m.optimizer_cpu_offload:
        offload = dict(
            optimizer_cpu_offload=True,
            optimizer_offload_fraction=offload_fraction(m),
            overlap_cpu_optimizer_d2h_h2d=m.overlap_cpu_optimizer_d2h_h2d,
        )
    precision_aware = resolved_precision_aware(m)
    # megatron-core 0.16.1's OptimizerConfig reads TransformerEngine's version whenever the optimizer
    # is precision-aware (TypeError without TE), only to choose store_param_remainders, which TE's
    # FusedAdam alone uses; the CPU optimizer returns right after. So without TE the config is built
    # plain and given the two flags its __post_init__ would have set on the CPU-offload path.
    late = precision_aware and m.optimizer_cpu_offload and not transformer_engine_available()
    config = OptimizerConfig(
        optimizer="adam",
        lr=o.lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.betas[0],
        adam_beta2=o.betas[1],
        adam_eps=o.eps,
        clip_grad=actor.grad_clip,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=m.use_distributed_optimizer,
        use_precision_aware_optimizer=precision_aware and not late,
        **offload,
    )
    if late:
        config.use_precision_aware_optimizer = True
        config.use_precision_aware_optimizer_no_fp8_or_ds_fp8 = True  # decoupled fp32 grads to the CPU
        config.store_param_remainders = False
    return config


def build_optimizer(config, model: list):
    """megatron-core's optimizer over `model` (DDP chunks), with the distributed optimizer's
    parameter-to-state map made right for param groups that mix fp32 and 16-bit parameters.

    megatron-core 0.16.1 numbers each group's parameters in grad-buffer order (the bf16 buffer
    before the fp32 one), but lists the group's optimizer parameters fp32 shards first: in a mixed
    group (a bf16 critic trunk with its fp32 value head) every checkpoint read or write then pairs a
    parameter with another one's state; a save fails on the first size mismatch and a load fills
    same-sized parameters with each other's state. Here the map follows the optimizer's order.

    The CPU optimizer (HybridDeviceOptimizer) with the fp32 masters on the device
    (use_precision_aware_optimizer false) steps fp32 parameters, of which it keeps no fp32 copies,
    yet megatron builds it to update 16-bit parameters through fp32 copies: its load then looks up
    each parameter's copy and fails (KeyError), so such a run could not be resumed. Told its
    parameters are fp32 already, it steps them as before and loads."""
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    optimizer = get_megatron_optimizer(config, model)
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(o, DistributedOptimizer):
            _align_group_order(o)
        inner = getattr(o, "optimizer", None)
        if isinstance(inner, HybridDeviceOptimizer) and not inner.param_to_fp32_param:
            inner.param_update_in_fp32 = False
    return optimizer


def _align_group_order(o) -> None:
    """model_param_group_index_map[param] = (group, place) of param's shard in the inner
    optimizer's param_groups, which megatron builds as [*fp32 shards, *16-bit shards] per group."""
    for group, (fp32, half) in enumerate(zip(o.model_fp32_groups, o.model_float16_groups, strict=True)):
        for place, param in enumerate([*fp32, *half]):
            o.model_param_group_index_map[param] = (group, place)
        o.opt_group_ranges[group]["params"] = [*fp32, *half]
    for param, (group, place) in o.model_param_group_index_map.items():
        shard = o.optimizer.param_groups[group]["params"][place]
        size = o._get_model_param_range_map(param)["param"].size
        if shard is not None and shard.numel() != size:  # None: precision-aware, held by the optimizer
            raise RuntimeError(
                f"megatron optimizer: the {size} elements of a {tuple(param.shape)} parameter map to "
                f"a {shard.numel()}-element optimizer shard"
            )
