"""Role specs: the one table of what each role runs, built once from the config (by
dagrl/config/role_specs.py, from the types and settings defined here).

Placement (parallel sizes), validation (DP divisibility), the dry-run plan (memory estimate) and
backend construction (registry key) read these specs; nothing else decodes the config per role.
Built-in roles are `Role` members (the one vocabulary of role names: members are strings, so
they compare, hash and format as the names the DAG files use); plugins declare more under
`roles.<name>` (their kind is their name, so their backends register under it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dagrl.config.schema import (
    ActorConfig,
    CriticConfig,
    DagrlConfig,
    LoraSync,
    MegatronConfig,
    RolloutConfig,
    SelfTeacher,
)
from dagrl.registry import BACKENDS


class Role(StrEnum):
    """The built-in roles, the one vocabulary of role names (DAG files, placement, specs). A plugin
    role is a plain string (its name under `roles.<name>`)."""

    train = "train"
    rollout = "rollout"
    ref = "ref"
    teacher = "teacher"
    critic = "critic"  # PPO's value model (critic.*): a train backend with a value head
    reward = "reward"  # a name for a plugin's reward role: no built-in backend
    # the sampling pipeline (dagrl/sample) and reward models as roles (dagrl/backends/reward_model.py)
    sampler = "sampler"  # a rollout backend on the policy's model, or the teacher's (distill)
    orm = "orm"  # outcome reward model: one score per response
    prm = "prm"  # process reward model: a score per step
    rm = "rm"  # GRPO's reward model (reward.model.*)

    def __repr__(self) -> str:  # messages and plans show the name the config and DAG files use
        return repr(self.value)


# the backend kind of orm / prm / rm (dagrl/backends/reward_model.py): sequence-classification, forward-only
KIND_REWARD_MODEL = "reward_model"


@dataclass(frozen=True)
class ModelSpec:
    """The model a role loads: its directory (or hub id), weights dtype and tokenizer."""

    path: str | None  # None = the built-in tiny model
    dtype: str
    tokenizer: str | None  # None = the model's own
    trust_remote_code: bool = False


@dataclass(frozen=True)
class ParallelLayout:
    """How one model replica is split over devices: tensor, pipeline and context parallel sizes."""

    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp


@dataclass(frozen=True)
class OffloadPolicy:
    """What a role keeps in host memory between its turns on a shared device."""

    params: bool = False
    grads: bool = False
    optimizer: bool = False


@dataclass(frozen=True)
class SequenceLimits:
    """The token lengths a role's sequences are held to (data.max_prompt_length / max_response_length)."""

    prompt: int = 0
    response: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.response


ALL_LINEAR = "all-linear"  # PEFT's name for every linear layer but the output layer


@dataclass(frozen=True)
class LoraSettings:
    """LoRA of the policy (actor_rollout_ref.model.lora_*), set on the train and rollout roles'
    specs when lora_rank > 0. `sync`: what the weight sync carries, rollout.lora_sync resolved for
    the configured engine and placement (`lora_sync_choice`): adapter (the adapters; the engine
    serves LoRA) or merged."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...] | str = ALL_LINEAR
    dropout: float = 0.0
    sync: LoraSync = LoraSync.merged
    sync_reason: str = field(default="", compare=False)  # why auto chose `sync` ("": given)


@dataclass(frozen=True)
class TrainSettings:
    """What a train backend (torch, megatron) reads besides its model: how its forward passes run
    and, for the trained role, its update. Set on the train and ref roles and a colocated teacher."""

    temperature: float = 1.0  # rollout.temperature: log-probs are scored as the rollout sampled
    packing: bool = False  # model.use_remove_padding: sequences packed into rows without padding
    gradient_checkpointing: bool | None = None  # model.gradient_checkpointing (auto resolved in prepare)
    logprob_token_budget: int | None = None  # tokens per log-prob forward; None = micro-batches of rows
    teacher_micro_batch_size: int = 1  # sequences per teacher forward run on this backend
    weight_sync_bucket_mb: int = 256  # the size of the buckets export_weights yields
    group_size: int = 1  # rollout.n: responses per prompt (the update's mini-batches count prompts)
    # the update's section (optimizer, batches, epochs, clip): the actor's, or the critic's with
    # its defaults resolved (`critic_update`); None = forward-only
    update: ActorConfig | CriticConfig | None = None


@dataclass(frozen=True)
class RoleSpec:
    """What one role runs, decoded once from the config (`role_spec`): the one object a backend
    is built from.

    A backend reads its model, dtype, parallel layout, micro-batch sizes, offload policy, seed and
    sequence limits from here, plus its engine's own section (`megatron` for the megatron
    backend, `rollout` for a rollout engine, `engine_kwargs` for a standalone engine,
    `reward_model` for role rm), never the
    config tree: a teacher is the train backend with a spec whose model is the teacher's, a distill
    sampler the rollout engine with the teacher's model. Placement, validation and the memory plan
    read the same specs, so the role table exists once.
    """

    name: str
    kind: str  # a Role value, or the role's own name for plugin roles
    backend: str  # registry name under (kind, backend)
    backend_key: str  # the config key that chose the backend (for errors)
    model: ModelSpec
    parallel: ParallelLayout = field(default_factory=ParallelLayout)
    micro_batch_size: int = 1  # sequences per forward on one device (the update's, for a trained role)
    logprob_micro_batch_size: int = 1  # sequences per forward of the role's log-prob passes
    trains: bool = False
    offload: OffloadPolicy = field(default_factory=OffloadPolicy)
    megatron: MegatronConfig | None = None  # set when the backend is megatron
    train: TrainSettings | None = None  # set for roles on a train backend (train, ref, colocated teacher)
    seed: int = 0  # trainer.seed: weights' init, sampling, the engine's own seed
    lengths: SequenceLimits = field(default_factory=SequenceLimits)
    rollout: RolloutConfig | None = None  # a rollout engine's section: sampling, engine knobs, multi-turn
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # a standalone engine's extra arguments
    reward_model: Any = None  # role rm's section (reward.model.*: a judge's template, tokens, engine share)
    lora: LoraSettings | None = None  # the policy's LoRA (train and rollout roles); None = full weights
    card_gib: float | None = None  # trainer.gpu_memory_gib: the card the plan counted; None = the GPU

    @property
    def builtin(self) -> bool:
        """Whether dagrl ships backends for this role (reward and plugin roles bring their own)."""
        return self.kind in (Role.train, Role.rollout, Role.ref, Role.teacher, Role.critic, KIND_REWARD_MODEL)


def teacher_model_path(cfg: DagrlConfig) -> str | None:
    """The teacher's model path: teacher.model, or the student's (None = the shipped tiny model)
    when the teacher is the student itself (`self`, `self_current`)."""
    if cfg.teacher.model in (SelfTeacher.self.value, SelfTeacher.self_current.value):
        return cfg.actor_rollout_ref.model.path
    return cfg.teacher.model


def train_hooks(cfg: DagrlConfig):
    """The hooks the configured train backend (actor.strategy) registered for its roles' specs
    (dagrl/backends/train_hooks.py: TrainHooks); None for a backend without them (or unknown:
    validate names the key)."""
    strategy = cfg.actor_rollout_ref.actor.strategy
    return BACKENDS.backend(strategy).hooks if BACKENDS.find(Role.train, strategy) is not None else None


def _compute_dtype(cfg: DagrlConfig) -> str | None:
    """The train backend's compute dtype where it is its own (megatron's param_dtype), else None."""
    hooks = train_hooks(cfg)
    if hooks is None or hooks.compute_dtype is None:
        return None
    return hooks.compute_dtype(cfg)


def rollout_dtype(cfg: DagrlConfig) -> str:
    """The rollout engine's weights dtype: rollout.dtype, else the trainer's compute dtype (a siiRL
    script with megatron.param_dtype=bfloat16 samples in bf16, not in model.dtype's fp32)."""
    arr = cfg.actor_rollout_ref
    if arr.rollout.dtype is not None:
        return dtype_name(arr.rollout.dtype)
    return _compute_dtype(cfg) or dtype_name(arr.model.dtype)


def _sampler_dtype(cfg: DagrlConfig, model_dtype: str) -> str:
    """A distill sampler's engine dtype: as `rollout_dtype`, with the teacher's dtype in place of
    the student's model dtype."""
    arr = cfg.actor_rollout_ref
    if arr.rollout.dtype is not None or _compute_dtype(cfg) is not None:
        return rollout_dtype(cfg)
    return dtype_name(model_dtype)


def dtype_name(dtype) -> str:
    return str(getattr(dtype, "value", dtype))


def role_aliases(cfg: DagrlConfig) -> dict[str, str]:
    """Roles a DAG names that run on another role's workers under this config: a `self_current`
    teacher is the train role's own model (no pool, no weights of its own); the reference of a
    LoRA actor colocated with it is the actor's base with the adapter
    disabled (no second copy of the model)."""
    aliases = {}
    if cfg.teacher.model == SelfTeacher.self_current.value:
        aliases[Role.teacher.value] = Role.train.value
    if lora_reference_is_base(cfg):
        aliases[Role.ref.value] = Role.train.value
    return aliases


def lora_reference_is_base(cfg: DagrlConfig) -> bool:
    """LoRA on a train backend whose reference can be the actor's base (its hooks'
    `lora_reference_is_base`: torch and megatron) with the ref role in the train role's colocate group."""
    hooks = train_hooks(cfg)
    if policy_lora(cfg) is None or hooks is None or not hooks.lora_reference_is_base:
        return False
    return _colocated(cfg, Role.train, Role.ref)


def _colocated(cfg: DagrlConfig, a: str, b: str) -> bool:
    """Roles `a` and `b` share a colocate group (placement.colocate_groups or device_groups)."""
    if cfg.placement.device_groups is not None:
        from dagrl.config.device_groups import _as_dict

        raw = _as_dict(cfg.placement.device_groups)  # its shape is checked when the plan is made
        groups = [list(g.get("workers", ())) for g in raw.values() if isinstance(g, dict)]
    else:
        groups = cfg.placement.colocate_groups
    return any(a in g and b in g for g in groups)


def lora_sync_choice(cfg: DagrlConfig) -> tuple[LoraSync, str]:
    """rollout.lora_sync resolved, and why auto chose it ("" when it was given). Merged where the
    engine serves no adapters in its dtype, or shares the trainer's devices: the merged weights
    are copied on the device (bytes cost little there) and the engine decodes without LoRA
    kernels; adapter where the weights cross devices or nodes, which the adapters' ~1/20 of the
    bytes pays (docs/lora.md: "Which sync, and why the defaults")."""
    r = cfg.actor_rollout_ref.rollout
    if r.lora_sync != LoraSync.auto:
        return r.lora_sync, ""
    dtype, serves = rollout_dtype(cfg), BACKENDS.backend(r.name).lora_dtypes or ()
    if not serves:
        return LoraSync.merged, f"the {r.name} engine serves no adapters"
    if dtype not in serves:
        return LoraSync.merged, f"the {r.name} engine serves adapters in {'/'.join(serves)}, not {dtype}"
    if _colocated(cfg, Role.train, Role.rollout):
        return LoraSync.merged, (
            "the engine shares the trainer's devices: the merged weights are an on-device copy, and"
            " decoding runs without LoRA kernels"
        )
    return LoraSync.adapter, "the weights cross devices: the adapters only, the base stays in the engine"


def policy_lora(cfg: DagrlConfig) -> LoraSettings | None:
    """The policy's LoRA settings, None when it trains all weights (lora_rank = 0)."""
    m = cfg.actor_rollout_ref.model
    if m.lora_rank <= 0:
        return None
    targets = m.target_modules
    if isinstance(targets, str) and targets != ALL_LINEAR:
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    sync, reason = lora_sync_choice(cfg)
    return LoraSettings(
        rank=m.lora_rank,
        alpha=float(m.lora_alpha),
        target_modules=targets if isinstance(targets, str) else tuple(str(t) for t in targets),
        dropout=float(m.lora_dropout),
        sync=sync,
        sync_reason=reason,
    )


def _train_settings(cfg: DagrlConfig, trains: bool) -> TrainSettings:
    """A train backend's settings: the trained role's log-prob pass is the old log-probs'
    (rollout.log_prob_*), a forward-only role's the reference's (ref.log_prob_*)."""
    arr = cfg.actor_rollout_ref
    passes = arr.rollout if trains else arr.ref
    return TrainSettings(
        temperature=arr.rollout.temperature,
        packing=arr.model.use_remove_padding,
        gradient_checkpointing=arr.model.gradient_checkpointing,
        logprob_token_budget=(
            passes.log_prob_max_token_len_per_gpu if passes.log_prob_use_dynamic_bsz else None
        ),
        teacher_micro_batch_size=cfg.teacher.log_prob_micro_batch_size_per_gpu,
        weight_sync_bucket_mb=arr.rollout.weight_sync_bucket_mb,
        group_size=arr.rollout.n,
        update=arr.actor if trains else None,
    )


def _section(cfg: DagrlConfig, trains: bool) -> MegatronConfig | None:
    """The train backend's own config section (its `config_type`) in actor.* for a trained role,
    in ref.* for a forward-only one (ref, colocated teacher); None: it has none, as the
    data-parallel torch backend."""
    arr = cfg.actor_rollout_ref
    return BACKENDS.own_section(arr.actor if trains else arr.ref, arr.actor.strategy)


def _layout(cfg: DagrlConfig, section) -> ParallelLayout:
    hooks = train_hooks(cfg)
    if section is None or hooks is None or hooks.layout is None:
        return ParallelLayout()
    return hooks.layout(section)


def _offload(cfg: DagrlConfig, section) -> OffloadPolicy:
    """The train/ref roles' offload: the backend's own switches (megatron's three), or the generic
    actor.offload (params and optimizer state together)."""
    hooks = train_hooks(cfg)
    if section is not None and hooks is not None and hooks.offload is not None:
        return hooks.offload(cfg, section)
    on = cfg.actor_rollout_ref.actor.offload is not False  # null (auto) until the plan says
    return OffloadPolicy(params=on, grads=on, optimizer=on)
