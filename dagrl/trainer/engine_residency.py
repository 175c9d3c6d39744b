"""Whether the rollout engine stays awake beside its colocated trainer: the memory plan's automatic
choice of `actor_rollout_ref.rollout.free_cache_engine` and `gpu_memory_utilization` (issue 29).

An engine that sleeps hands the card over every step: it frees its weights and KV cache before
the update and wakes them for the weight sync, and torch's cache is emptied at every hand-over, so
the update's blocks are mapped again each step. Awake, none of that happens, and the trainer stays
resident too. That is the fastest setting wherever it fits, so auto tries it first: the engine's
share is sized for the step's work (`backends/vllm/memory.py: awake_share`), the trainer's own auto
choices are made again beside it (recomputation, the optimizer's place, offload), and the engine
stays awake when every phase then fits within RESIDENT_SHARE of the card and the trainer's choices
cost no more than asleep. Recomputation is the one exception: it costs about a quarter of the
update (one more forward of the decoder layers, not of the output layer), where sleeping costs the
weight sync's wake, the sleep and the allocator's re-growth every step, measured 0.3-0.6 s at 0.6B
to 4B (docs/memory.md gives the figures); the optimizer on the host or the trainer offloaded
around the rollout cost more than the sleep saves, so those keep the engine asleep.

Otherwise the choice is today's: the engine sleeps, at SLEEPING_SHARE of the card. Only a
single-turn vLLM rollout with one engine per card in the trainer's colocate group is sized here;
a separate rollout never sleeps anyway, multi-turn episodes and the sampling pipeline keep
today's setting.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

from dagrl.backends.memory import GIB, param_width
from dagrl.backends.model_shape import read_model_shape
from dagrl.backends.vllm.memory import SLEEPING_SHARE, awake_share
from dagrl.config.placement import Plan
from dagrl.config.roles import Role
from dagrl.config.schema import DagrlConfig
from dagrl.registry import BACKENDS

R = "actor_rollout_ref.rollout"
# auto keeps state resident (an engine awake, a trainer between phases) only with this much of the
# card planned: the rest absorbs what the plan does not see (fragmentation, a generate's buffers)
RESIDENT_SHARE = 0.9
# resolve(cfg, plan, limit) -> MemoryPlan: the trainer's auto choices, each fitting limit x the card
Resolver = Callable[[DagrlConfig, Plan, float], object]


def settle_engine_defaults(cfg: DagrlConfig) -> None:
    """What auto leaves open where it does not choose: the engine sleeps, at SLEEPING_SHARE."""
    r = cfg.actor_rollout_ref.rollout
    if r.free_cache_engine is None:
        r.free_cache_engine = True
    if r.gpu_memory_utilization is None:
        r.gpu_memory_utilization = SLEEPING_SHARE


def why_asleep(cfg: DagrlConfig, plan: Plan) -> str | None:
    """Why auto does not consider an awake engine here (None: it does)."""
    r = cfg.actor_rollout_ref.rollout
    if r.free_cache_engine is not None and r.gpu_memory_utilization is not None:
        return "both set"
    if r.free_cache_engine is True:
        return "the engine sleeps (set)"
    spec, layout = plan.specs.get(Role.rollout), plan.roles.get(Role.rollout)
    if spec is None or layout is None or Role.train not in plan.roles:
        return "no rollout engine beside a trainer (e.g. the sampling pipeline)"
    if not BACKENDS.backend(spec.backend).starts_first:
        return "the rollout engine takes no share of the card"
    if Role.train not in plan.groups[layout.group].roles:
        return "the rollout has devices of its own and never sleeps"
    if layout.tp != 1:
        return "one engine spans several cards"
    if r.multi_turn.enable:
        return "multi-turn episodes"
    return None


def engine_share(cfg: DagrlConfig, plan: Plan, model_path: str, card_bytes: float) -> tuple[float, int, int]:
    """(the awake engine's share, its sequences per step, their context in tokens): the step's
    rows over the engine replicas, at prompt + response length (or rollout.max_model_len)."""
    spec, layout = plan.specs[Role.rollout], plan.roles[Role.rollout]
    r = cfg.actor_rollout_ref.rollout
    rows = math.ceil(cfg.data.train_batch_size * r.n / layout.dp)
    context = r.max_model_len or spec.lengths.total
    shape = read_model_shape(model_path, cfg.actor_rollout_ref.model.trust_remote_code)
    width = param_width(spec.model.dtype)
    return awake_share(shape, width, layout.tp, rows, context, card_bytes), rows, context


def resolve_residency(cfg: DagrlConfig, plan: Plan, model_path: str, card_bytes: float, resolve: Resolver):
    """Decide free_cache_engine / gpu_memory_utilization where left to auto, then make the
    trainer's auto choices for that setting; the MemoryPlan of the choice, its notes first."""
    r = cfg.actor_rollout_ref.rollout
    reason = why_asleep(cfg, plan)
    if reason is not None:
        settle_engine_defaults(cfg)
        return resolve(cfg, plan, 1.0)
    share, rows, context = engine_share(cfg, plan, model_path, card_bytes)
    util = r.gpu_memory_utilization if r.gpu_memory_utilization is not None else share
    sized = (
        f"weights + KV cache for {rows} x {context} tokens + vLLM's own, {util * card_bytes / GIB:.1f} GiB"
    )
    if r.free_cache_engine is False:  # awake by the user's choice: only the share is auto's
        r.gpu_memory_utilization = util
        memory = resolve(cfg, plan, 1.0)
        memory.notes.insert(0, f"{R}.gpu_memory_utilization: auto -> {util} ({sized})")
        return memory
    asleep = _trial(cfg, plan, resolve, True, r.gpu_memory_utilization or SLEEPING_SHARE, 1.0)
    awake = _trial(cfg, plan, resolve, False, util, RESIDENT_SHARE)
    slower = _slower_choices(awake, asleep)
    peak, limit = awake[2].peak(), RESIDENT_SHARE * card_bytes
    stays = peak <= limit and not slower
    r.free_cache_engine = not stays
    notes = []
    if r.gpu_memory_utilization is None:
        r.gpu_memory_utilization = util if stays else SLEEPING_SHARE
        text = sized if stays else "the engine sleeps"
        notes.append(f"{R}.gpu_memory_utilization: auto -> {r.gpu_memory_utilization} ({text})")
    why = (
        f"peak {peak / GIB:.1f} GiB with the engine awake at {util}"
        f"{' over' if peak > limit else ' within'} {RESIDENT_SHARE:.0%} of {card_bytes / GIB:.0f} GiB"
    )
    if slower:
        why += f"; awake, {', '.join(slower)}: slower than sleeping"
    notes.insert(0, f"{R}.free_cache_engine: auto -> {str(not stays).lower()} ({why})")
    memory = resolve(cfg, plan, RESIDENT_SHARE if stays else 1.0)
    memory.notes[:0] = notes
    return memory


def _trial(cfg: DagrlConfig, plan: Plan, resolve: Resolver, sleeps: bool, util: float, limit: float):
    """(config, plan, MemoryPlan) of one setting, resolved on copies: the real ones stay open."""
    trial_cfg, trial_plan = copy.deepcopy((cfg, plan))
    r = trial_cfg.actor_rollout_ref.rollout
    r.free_cache_engine, r.gpu_memory_utilization = sleeps, util
    return trial_cfg, trial_plan, resolve(trial_cfg, trial_plan, limit)


def _slower_choices(awake: tuple, asleep: tuple) -> list[str]:
    """The trainer's settings auto chose awake that cost more than sleeping does: the optimizer on
    the host (its Adam step bounds the step, 11-13 s at 4B against the sleep's 0.3-0.6 s, and what
    the card has left serves its on-device share better than an awake engine), the trainer
    offloaded around the rollout where asleep it stays."""
    out = []
    train = awake[1].specs.get(Role.train)
    hooks = BACKENDS.backend(train.backend).hooks if train is not None else None
    if hooks is not None:
        owner, key = hooks.optimizer_host(awake[0])
        if owner.optimizer_cpu_offload:
            out.append(f"{key}=true")
    if awake[0].actor_rollout_ref.actor.offload and not asleep[0].actor_rollout_ref.actor.offload:
        out.append("actor_rollout_ref.actor.offload=true")
    return out
