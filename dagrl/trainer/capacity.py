"""Does the job fit? Device memory against the per-phase memory plan (dagrl/trainer/memory_plan.py),
the dataset against the batch size.

Both run in `prepare`, before Ray starts: a dry run prints the memory warning and goes on (the plan
is often made on a laptop for a cluster), a real run refuses, naming the phase and the keys that
lower it; a batch larger than the dataset is refused by both. Defaults left to `auto` are chosen
here from the plan (whether the engine stays awake: engine_residency.py; gradient checkpointing,
the optimizer's place, offload).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from functools import partial

from dagrl.backends.memory import GIB
from dagrl.backends.train_hooks import TrainHooks
from dagrl.config.placement import Plan
from dagrl.config.roles import OffloadPolicy, Role, RoleSpec
from dagrl.config.schema import DagrlConfig
from dagrl.config.validate import data_files
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS, load_builtins
from dagrl.trainer.engine_residency import RESIDENT_SHARE, resolve_residency, settle_engine_defaults
from dagrl.trainer.memory_plan import MemoryPlan, describe, plan_memory

A, R, REF, M = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)

ASSUMED_GPU_GIB = 80.0  # a dry run on a machine without a GPU checks against an 80 GB card


def backend_levers(which: str, sep: str = ", ") -> str:
    """The keys the plan's advice names, `which` = "device_levers", "host_levers" or "idle_levers":
    each registered train backend's own (its hooks' text), in the order they registered."""
    load_builtins()
    texts = [getattr(b.hooks, which) for b in BACKENDS.backends.values() if b.hooks is not None]
    return sep.join(t for t in texts if t)


def device_levers() -> str:
    return (
        f"bf16 weights (actor_rollout_ref.model.dtype=bfloat16), {backend_levers('device_levers')}; "
        "or set trainer.gpu_memory_gib if the device is larger"
    )


def device_memory_gib(cfg: DagrlConfig) -> tuple[float | None, str]:
    """(GiB per device, where the figure comes from); None when nothing says (a real run without a
    visible GPU, e.g. a driver on a CPU head node)."""
    if cfg.trainer.gpu_memory_gib is not None:
        return cfg.trainer.gpu_memory_gib, "trainer.gpu_memory_gib"
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30, "the visible GPU"
    if cfg.trainer.dry_run:
        return ASSUMED_GPU_GIB, "assumed; set trainer.gpu_memory_gib"
    return None, ""


def plan_device_memory(
    cfg: DagrlConfig, plan: Plan, model_path: str, phases: set[str] | None = None
) -> tuple[MemoryPlan | None, str | None]:
    """The per-phase memory plan of a GPU plan (None on CPU or with no figure for the card), with
    the defaults it chooses where left to auto (whether the engine stays awake, then the trainer's
    recomputation, optimizer place and offload), and the warning a dry run
    prints where a phase does not fit; a real run raises ConfigError instead."""
    if plan.device != "cuda":
        settle_engine_defaults(cfg)
        return None, None
    capacity, source = device_memory_gib(cfg)
    if capacity is None:
        settle_engine_defaults(cfg)
        return None, None

    def resolve(job: DagrlConfig, job_plan: Plan, limit: float) -> MemoryPlan:
        """The trainer's auto choices for `job` (the real config or a trial copy), the update
        fitting `limit` x the card (beside an awake engine RESIDENT_SHARE of it, else all of it)."""
        make_plan = partial(plan_memory, job, job_plan, model_path, capacity, source, phases)
        memory = _resolve_recompute(job, job_plan, make_plan, limit)
        memory = _resolve_optimizer_host(job, job_plan, make_plan, memory, limit)
        memory = _resolve_offload_fraction(job, job_plan, make_plan, memory)
        return _resolve_offload(job, job_plan, make_plan, memory)

    memory = resolve_residency(cfg, plan, model_path, capacity * GIB, resolve)
    _specs_follow(cfg, plan)
    return memory, check_memory(cfg, memory, plan) or check_host_memory(cfg, memory)


def host_memory_gib(cfg: DagrlConfig) -> tuple[float | None, str]:
    """(GiB of host memory per node, where the figure comes from): trainer.host_memory_gib, else in
    a real run this machine's (the nodes alike); None in a dry run (often made on another machine)."""
    if cfg.trainer.host_memory_gib is not None:
        return cfg.trainer.host_memory_gib, "trainer.host_memory_gib"
    if cfg.trainer.dry_run:
        return None, ""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, "this machine's memory"


def host_over(cfg: DagrlConfig, memory: MemoryPlan) -> tuple[int, float, float, str] | None:
    """(node, planned bytes, capacity GiB, its source) of the node whose planned host state exceeds
    RESIDENT_SHARE of its memory; None when every node fits or there is no figure."""
    capacity, source = host_memory_gib(cfg)
    if capacity is None or not memory.host:
        return None
    node, roles = max(memory.host.items(), key=lambda item: sum(item[1].values()))
    planned = sum(roles.values())
    return None if planned <= RESIDENT_SHARE * capacity * GIB else (node, planned, capacity, source)


def check_host_memory(cfg: DagrlConfig, memory: MemoryPlan) -> str | None:
    """The host state the plan puts on a node (offloaded state, a CPU optimizer's fp32 state, an
    engine's weights asleep) against RESIDENT_SHARE of the node's memory, the rest left to the
    processes themselves: a warning for a dry run, a ConfigError for a real run; None when it fits
    or there is no figure."""
    from dagrl.trainer.memory_plan import describe_host

    over = host_over(cfg, memory)
    if over is None:
        return None
    node, planned, capacity, source = over
    roles = memory.host[node]
    message = (
        f"the plan keeps {planned / GIB:.1f} GiB in host memory on node {node} ({describe_host(roles)}), over "
        f"{RESIDENT_SHARE:.0%} of its {capacity:.0f} GiB ({source}); levers: {backend_levers('host_levers')}, the "
        f"engine's weights dropped while asleep ({R}.sleep_level=2), or set "
        f"trainer.host_memory_gib if the nodes have more"
    )
    if not cfg.trainer.dry_run:
        raise ConfigError("trainer.host_memory_gib", cfg.trainer.host_memory_gib, message)
    return message


def _specs_follow(cfg: DagrlConfig, plan: Plan) -> None:
    """The role specs the workers are built from carry the choices made here: they were decoded
    before the plan resolved auto (a backend reads its spec, not the config)."""
    recompute = cfg.actor_rollout_ref.model.gradient_checkpointing
    for role, spec in plan.specs.items():
        if spec.train is not None and spec.train.gradient_checkpointing != recompute:
            train = dataclasses.replace(spec.train, gradient_checkpointing=recompute)
            plan.specs[role] = dataclasses.replace(spec, train=train)


def _resolve_optimizer_host(
    cfg: DagrlConfig, plan: Plan, make_plan: Callable[[], MemoryPlan], memory: MemoryPlan, limit: float = 1.0
) -> MemoryPlan:
    """optimizer_cpu_offload=None (auto: actor.optimizer_cpu_offload on the torch backend,
    actor.megatron.optimizer_cpu_offload on megatron): the optimizer's fp32 state and step stay on
    the device when the update fits the card that way (after recomputation), else go to the host.
    Megatron keeps its state on the device between phases (unless megatron.*_offload say
    otherwise), so there every phase must also stay within RESIDENT_SHARE of the card; the torch
    trainer's own offload between phases is resolved after this (_resolve_offload)."""
    hooks = train_hooks_of(plan)
    if hooks is None:
        return memory
    owner, key = hooks.optimizer_host(cfg)
    if owner.optimizer_cpu_offload is not None:
        return memory
    owner.optimizer_cpu_offload = False
    if plan.specs[Role.train].lora is not None:  # the adapters' optimizer state is megabytes
        return memory
    if hooks.optimizer_host_blocked(cfg) is not None:  # the backend cannot step it there
        return memory
    on_device = memory.peak("update")
    peak = memory.peak()
    tight = hooks.resident_between_phases and peak > RESIDENT_SHARE * memory.card_bytes
    if on_device <= limit * memory.card_bytes and not tight:
        return memory
    owner.optimizer_cpu_offload = True
    hosted = make_plan()
    hosted.notes = memory.notes + [
        f"{key}: auto -> true (update {on_device / GIB:.1f} GiB, peak {peak / GIB:.1f} GiB with the "
        f"optimizer on the device; update {hosted.peak('update') / GIB:.1f} GiB with it on the host)"
    ]
    return hosted


FRACTIONS = tuple(round(0.05 * k, 2) for k in range(1, 20))  # the shares auto tries below 1.0


def _resolve_offload_fraction(
    cfg: DagrlConfig, plan: Plan, make_plan: Callable[[], MemoryPlan], memory: MemoryPlan
) -> MemoryPlan:
    """The CPU optimizer's share left to auto (a backend's `optimizer_share` hook: megatron's
    optimizer_offload_fraction) with the CPU optimizer on: 1.0 (every parameter's optimizer state
    on the host) where the host holds it; else the smallest share that keeps every phase within
    RESIDENT_SHARE of the card and the host within its share too (less on the host is also a
    faster step: the rest steps on the device). None fits: 1.0, and the host check names the
    figures and levers."""
    hooks = train_hooks_of(plan)
    if hooks is None or hooks.optimizer_share is None:
        return memory
    owner, key = hooks.optimizer_share(cfg)
    name = key.rsplit(".", 1)[1]
    if not hooks.optimizer_host(cfg)[0].optimizer_cpu_offload or getattr(owner, name) is not None:
        return memory
    setattr(owner, name, 1.0)
    over = host_over(cfg, memory)
    if over is None:
        return memory
    for fraction in FRACTIONS:
        setattr(owner, name, fraction)
        split = make_plan()
        if split.peak() <= RESIDENT_SHARE * split.card_bytes and host_over(cfg, split) is None:
            split.notes = memory.notes + [
                f"{key}: auto -> {fraction} (host {over[1] / GIB:.1f} GiB at 1.0, over {RESIDENT_SHARE:.0%} "
                f"of {over[2]:.0f} GiB; peak {split.peak() / GIB:.1f} GiB on the device at {fraction})"
            ]
            return split
    setattr(owner, name, 1.0)
    return memory


def hooks_of(spec: RoleSpec | None) -> TrainHooks | None:
    """The hooks a role's backend registered for the plan's automatic choices (None: no choice)."""
    return BACKENDS.backend(spec.backend).hooks if spec is not None else None


def train_hooks_of(plan: Plan) -> TrainHooks | None:
    """The train role's backend's plan hooks: the update's choices are its."""
    return hooks_of(plan.specs.get(Role.train))


def _resolve_offload(
    cfg: DagrlConfig, plan: Plan, make_plan: Callable[[], MemoryPlan], memory: MemoryPlan
) -> MemoryPlan:
    """actor.offload=None (auto) on a backend whose offload follows it (the torch backend's
    `auto_offload` hook): resident (no state moved between phases) when every phase fits within
    RESIDENT_SHARE of the card that way, else offloaded as planned."""
    actor = cfg.actor_rollout_ref.actor
    torch_roles = [
        r
        for r, s in plan.specs.items()
        if s.kind in (Role.train, Role.ref, Role.critic) and getattr(hooks_of(s), "auto_offload", False)
    ]
    if actor.offload is not None or not torch_roles:
        return memory
    offloaded = {r: plan.specs[r] for r in torch_roles}
    for role in torch_roles:
        plan.specs[role] = dataclasses.replace(plan.specs[role], offload=OffloadPolicy())
    resident = make_plan()
    peak = resident.peak()
    if peak <= RESIDENT_SHARE * resident.card_bytes:
        actor.offload = False
        resident.notes = memory.notes + [
            f"{A}.offload: auto -> false (peak {peak / GIB:.1f} GiB resident, card {resident.card_bytes / GIB:.0f} GiB)"
        ]
        return resident
    actor.offload = True
    plan.specs.update(offloaded)
    memory.notes.append(f"{A}.offload: auto -> true (peak {peak / GIB:.1f} GiB if resident)")
    return memory


def _resolve_recompute(
    cfg: DagrlConfig, plan: Plan, make_plan: Callable[[], MemoryPlan], limit: float = 1.0
) -> MemoryPlan:
    """model.gradient_checkpointing=None (auto): off when the update fits without it, else on; the
    choice and both figures become a note of the plan. On megatron (with recompute_granularity
    unset) on means megatron's full recompute, one layer per unit, as the key means there."""
    model = cfg.actor_rollout_ref.model
    hooks = train_hooks_of(plan)
    if model.gradient_checkpointing is not None or hooks is None:
        return make_plan()
    if hooks.recompute_pinned(cfg):
        return make_plan()  # the backend's own recompute keys set (megatron's recompute_*): the user's choice
    model.gradient_checkpointing = False
    memory = make_plan()
    without = memory.peak("update")
    if without <= limit * memory.card_bytes:
        memory.notes.append(f"{M}.gradient_checkpointing: auto -> false (update {without / GIB:.1f} GiB)")
        return memory
    model.gradient_checkpointing = True
    hooks.enable_recompute(cfg)
    memory = make_plan()
    memory.notes.append(
        f"{M}.gradient_checkpointing: auto -> true (update {without / GIB:.1f} GiB without, "
        f"{memory.peak('update') / GIB:.1f} GiB with)"
    )
    return memory


def check_memory(cfg: DagrlConfig, memory: MemoryPlan, plan: Plan) -> str | None:
    """The largest phase that exceeds the card, as a warning for a dry run; a real run raises
    ConfigError instead (under the key the user pinned, when unpinning it is the way out). None
    when every phase fits."""
    over = memory.over()
    if not over:
        return None
    group, row = over[0]
    message = (
        f"estimated memory per device exceeds the device's {memory.card_bytes / GIB:.0f} GiB "
        f"({memory.card_source}) in phase {row.phase} on group {group.group} ({', '.join(group.roles)}): "
        f"{row.total / GIB:.1f} GiB = {describe(row)}; levers: {phase_levers(plan, row)}; {device_levers()}"
    )
    if not cfg.trainer.dry_run:
        key, value = _pinned(cfg, plan, row)
        raise ConfigError(key, value, message)
    return message


def _pinned(cfg: DagrlConfig, plan: Plan, row) -> tuple[str, object]:
    """The key to name: gradient checkpointing pinned off where recomputation is the lever, else
    the card's size."""
    hooks = train_hooks_of(plan)
    if row.phase == "update" and hooks is not None and hooks.names_recompute_key:
        if cfg.actor_rollout_ref.model.gradient_checkpointing is False:
            return f"{M}.gradient_checkpointing", False
    if row.phase == "update" and hooks is not None:
        blocked = hooks.optimizer_host_blocked(cfg)
        if blocked is not None:  # what keeps the optimizer off the host
            return blocked
        owner, key = hooks.optimizer_host(cfg)
        if owner.optimizer_cpu_offload is False:  # pinned: auto moves it to the host when over
            return key, False
    if row.role != Role.train and row.others.get(Role.train) and hooks is not None and hooks.auto_offload:
        if cfg.actor_rollout_ref.actor.offload is False:  # pinned resident while another role runs
            return f"{A}.offload", False
    return "trainer.gpu_memory_gib", cfg.trainer.gpu_memory_gib


def oom_hint(memory: MemoryPlan | None, plan: Plan, phase: str) -> str:
    """For an out-of-memory error in `phase`: what the plan expected resident there and the keys
    that lower it, in one line ('' when the plan has no such phase)."""
    for group in memory.groups if memory is not None else ():
        for row in group.rows:
            if row.phase == phase:
                return (
                    f"planned {row.total / GIB:.1f} GiB: {describe(row)}; levers: {phase_levers(plan, row)}"
                )
    return ""


# a failing backend method (DeviceFault.phase) and its role -> the plan's phase
_FAULT_PHASES = {
    "train_step": "update",
    "generate": "rollout",
    "teacher_topk": "teacher",
    "teacher_hidden": "teacher",
    # an engine waking (the colocated refresh, a generate's onload): the rollout phase's figures
    "_copy_local": "rollout",
    "begin_weight_update": "rollout",
    "finish_weight_update": "rollout",
    "onload": "rollout",
}


def fault_plan_hint(memory: MemoryPlan | None, plan: Plan, fault) -> str:
    """oom_hint for a worker's CUDA out-of-memory fault ('' for other faults or unplanned phases)."""
    from dagrl.core.device_faults import CUDA_OOM

    if fault.kind != CUDA_OOM:
        return ""
    phase = _FAULT_PHASES.get(fault.phase)
    if fault.phase in ("score", "score_steps"):  # a reward model's pass: its role names the phase
        phase = str(fault.role)
    if str(fault.role) == Role.critic:  # the critic's two calls have phases of their own
        phase = {"compute_values": "values", "train_step": "critic_update"}.get(fault.phase)
    if fault.phase == "forward_logprobs":
        phase = {"ref": "ref_logprob", "teacher": "teacher"}.get(str(fault.role), "old_logprob")
    return oom_hint(memory, plan, phase) if phase else ""


def phase_levers(plan: Plan, row) -> str:
    """The keys that lower a phase's total: its own workload's, then what the idle roles keep."""
    spec = plan.specs.get(row.role)
    levers = {  # the update's are the actor's: computed for its row only
        "update": ", ".join(_update_levers(spec)) if row.phase == "update" else "",
        "old_logprob": f"a smaller {R}.log_prob_micro_batch_size_per_gpu or {R}.log_prob_use_dynamic_bsz=true "
        f"with {R}.log_prob_max_token_len_per_gpu",
        "ref_logprob": f"a smaller {REF}.log_prob_micro_batch_size_per_gpu or {REF}.log_prob_use_dynamic_bsz=true "
        f"with {REF}.log_prob_max_token_len_per_gpu",
        "teacher": "a smaller teacher.log_prob_micro_batch_size_per_gpu, teacher.offload=true",
        "values": "a smaller critic.forward_micro_batch_size_per_gpu, a larger critic.megatron.tensor_model_parallel_size"
        " (megatron)",
        "critic_update": "critic.model.gradient_checkpointing=true, a smaller critic.ppo_micro_batch_size_per_gpu, or "
        "critic.use_dynamic_bsz=true with critic.ppo_max_token_len_per_gpu, a larger "
        "critic.megatron.tensor_model_parallel_size (megatron)",
        "rollout": f"a lower {R}.gpu_memory_utilization",
        **dict.fromkeys(("rm", "orm", "prm"), "a smaller reward.model.micro_batch_size_per_gpu"),
    }[row.phase]
    if any(size > 0 for size in row.others.values()):
        levers += (
            f"; what idle roles keep: {R}.free_cache_engine=true (the engine sleeps), "
            f"{backend_levers('idle_levers', ' or ')}, teacher.offload=true"
        )
    return levers


def _update_levers(spec) -> list[str]:
    """The update's own levers, less those the spec already pulls (recomputation, the optimizer on
    the host: set by the user or chosen by auto): the backend's own (its `update_levers` hook), or
    the generic keys."""
    hooks = hooks_of(spec)
    if hooks is not None and hooks.update_levers is not None:
        recompute, optimizer = hooks.update_levers(spec)
    else:
        recompute, optimizer = _generic_update_levers(spec)
    batch = f"a smaller {A}.ppo_micro_batch_size_per_gpu or {A}.use_dynamic_bsz=true with {A}.ppo_max_token_len_per_gpu"
    return [lever for lever in (recompute, batch, optimizer) if lever is not None]


def _generic_update_levers(spec) -> tuple[str | None, str | None]:
    """model.gradient_checkpointing and actor.optimizer_cpu_offload, unless the spec pulls them."""
    train = spec.train if spec is not None else None
    recompute = (
        None if train is not None and train.gradient_checkpointing else f"{M}.gradient_checkpointing=true"
    )
    hosted = train is not None and train.update is not None and train.update.optimizer_cpu_offload
    optimizer = None if hosted else f"the optimizer on the host ({A}.optimizer_cpu_offload=true)"
    return recompute, optimizer


def check_dataset_size(cfg: DagrlConfig) -> None:
    """data.train_batch_size must not exceed the training rows (counted from the parquet metadata,
    before over-long prompts are filtered; the loader checks again after filtering)."""
    d = cfg.data
    if d.train_files is None:
        rows, what = d.builtin_train_rows, "data.builtin_train_rows (the built-in task)"
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        paths = [os.path.expanduser(p) for p in data_files(d.train_files)]
        try:
            rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths if os.path.isfile(p))
        except (pa.ArrowInvalid, OSError):
            return  # not parquet: the loader names the file and the fix, before any worker starts
        what = f"data.train_files ({', '.join(paths)})"
    if d.train_batch_size > rows:
        raise ConfigError(
            "data.train_batch_size",
            d.train_batch_size,
            f"larger than the {rows} rows of {what}; lower data.train_batch_size or add rows",
        )
