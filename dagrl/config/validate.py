"""Every cross-field rule, checked once before Ray starts anything.

Each failure is a ConfigError naming the key, the value and the fix.
"""

from __future__ import annotations

import os

from dagrl.config.placement import Plan
from dagrl.config.ranges import check_ranges
from dagrl.config.role_specs import role_spec
from dagrl.config.roles import Role, RoleSpec
from dagrl.config.schema import (
    BuiltinTask,
    DagrlConfig,
    Device,
    ResumeMode,
    TeacherPlacement,
    parse_resume_mode,
)
from dagrl.config.validate_critic import check_critic
from dagrl.config.validate_dapo import check_dapo
from dagrl.config.validate_lora import check_lora
from dagrl.config.validate_multi_turn import check_multi_turn, multi_turn_dag
from dagrl.config.validate_rollout import (
    check_engine_keys,
    check_off_policy_settings,
    check_overlap_placement,
    old_logprob_pass,
    rollout_logprobs_on,
)
from dagrl.config.validate_teacher import check_teacher_group, check_teacher_placement
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS, ESTIMATORS, OBJECTIVES

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"

BUILTIN_LR = 2e-4  # the tiny built-in model learns at rates no real LLM survives


def resolve_defaults(cfg: DagrlConfig) -> None:
    """Fill the defaults that depend on which model runs; the only place the config is changed."""
    optim = cfg.actor_rollout_ref.actor.optim
    if optim.lr is None:
        if cfg.actor_rollout_ref.model.path is not None:
            raise ConfigError(
                f"{A}.optim.lr", None, "set the learning rate for your model (e.g. 1e-6 for 1B–8B)"
            )
        optim.lr = BUILTIN_LR
    builtin_calculator = cfg.data.train_files is None and cfg.data.builtin_task == BuiltinTask.calculator
    if builtin_calculator and cfg.actor_rollout_ref.model.path is None:
        from dagrl.data.builtin_calculator import tiny_calculator_path

        cfg.actor_rollout_ref.model.path = tiny_calculator_path()  # taught the tool-call format
    rollout = cfg.actor_rollout_ref.rollout
    if not rollout.do_sample:  # verl's greedy switch: the engines and the trainer read temperature 0
        rollout.temperature = 0.0
    cfg.dag = multi_turn_dag(cfg)  # multi_turn.enable=true alone runs the algorithm's multi-turn DAG
    cfg.actor_rollout_ref.actor.recompute_old_logprobs = old_logprob_pass(cfg)  # auto: where needed
    cfg.actor_rollout_ref.rollout.calculate_log_probs = rollout_logprobs_on(cfg)  # auto: where read
    train = BACKENDS.find(Role.train, cfg.actor_rollout_ref.actor.strategy)
    if train is not None and train.resolve is not None:
        train.resolve(cfg)  # megatron: the ref takes the actor's layout, checkpointing is recompute
    if cfg.placement.device_groups is not None and cfg.trainer.n_gpus_per_node == 1:
        from dagrl.config.device_groups import declared_nproc

        # ms-swift's groups say how many GPUs a node has: no need to repeat it as n_gpus_per_node
        cfg.trainer.n_gpus_per_node = declared_nproc(cfg.placement.device_groups) or 1
    overlong = cfg.reward.overlong_buffer
    if overlong.len is None:  # DAPO's 4096 of 20480 tokens
        overlong.len = max(1, cfg.data.max_response_length // 5)
    uses_teacher = cfg.algorithm.name in ("gkd", "opsd") or cfg.algorithm.distill_reward.coef
    if uses_teacher and cfg.actor_rollout_ref.model.path is None and cfg.teacher.model is None:
        from dagrl.data.builtin import tiny_teacher_path

        cfg.teacher.model = tiny_teacher_path()  # the shipped student learns from the shipped teacher


def validate(cfg: DagrlConfig) -> None:
    """Rules that need only the config: first every field's own range (declared on the schema), then
    the rules between fields."""
    check_ranges(cfg)
    check_names(cfg)
    _check_data(cfg)
    _check_actor(cfg)
    check_lora(cfg)
    _check_rollout(cfg)
    OBJECTIVES.get(cfg.algorithm.name).validate(cfg)  # the chosen objective's own rules
    check_dapo(cfg)  # dynamic sampling and the overlong penalty
    check_critic(cfg)  # PPO's value model: critic.*, trainer.critic_warmup
    _check_trainer(cfg)
    _check_teacher(cfg)
    _backend_rules(cfg, role_spec(cfg, Role.train))  # the train backend's own rules (megatron's splits)


def _backend_rules(cfg: DagrlConfig, spec: RoleSpec) -> None:
    """The rules the role's backend registered with itself, after those the other backends of its
    kind registered for when they are not chosen (their own sections set to no effect)."""
    entry = BACKENDS.lookup(spec.kind, spec.backend, spec.backend_key)
    for name in BACKENDS.names(spec.kind):
        other = BACKENDS.find(spec.kind, name)
        if name != spec.backend and other.unused_rules is not None:
            other.unused_rules(cfg)
    entry.rules(cfg)


def check_role_rules(cfg: DagrlConfig, specs) -> None:
    """The config rules of every role's backend (the train backend's ran in `validate`), once per
    backend: what a role's engine refuses is refused before Ray starts."""
    seen = {(Role.train.value, cfg.actor_rollout_ref.actor.strategy)}
    for spec in specs:
        key = (getattr(spec.kind, "value", spec.kind), spec.backend)
        entry = BACKENDS.find(spec.kind, spec.backend)
        if key not in seen and entry is not None:
            seen.add(key)
            entry.rules(cfg)


def check_role_devices(cfg: DagrlConfig, specs, device: str) -> None:
    """What each role's backend needs of the resolved device (vLLM: GPUs, installed)."""
    for spec in specs:
        entry = BACKENDS.find(spec.kind, spec.backend)
        if entry is not None and entry.device_rules is not None:
            entry.device_rules(cfg, device)


def check_names(cfg: DagrlConfig) -> None:
    """The parts the config names by string are registered (built-ins register when their package
    is imported, plugins from external_plugins): a ConfigError naming the nearest otherwise."""
    OBJECTIVES.lookup(cfg.algorithm.name, "algorithm.name")
    ESTIMATORS.lookup(cfg.algorithm.adv_estimator, "algorithm.adv_estimator")
    BACKENDS.lookup(Role.train, cfg.actor_rollout_ref.actor.strategy, f"{A}.strategy")
    BACKENDS.lookup(Role.rollout, cfg.actor_rollout_ref.rollout.name, f"{R}.name")


def validate_roles(cfg: DagrlConfig, roles: set[str]) -> None:
    """The roles a DAG runs on exist in the config: a teacher needs teacher.model; any role without
    a built-in backend (reward, plugin roles) names its backend under roles.<name>."""
    if Role.teacher in roles and cfg.teacher.model is None:
        raise ConfigError("teacher.model", None, "the DAG runs a teacher node; set the teacher's model path")
    if Role.teacher not in roles and cfg.teacher.placement == TeacherPlacement.standalone:
        raise ConfigError(
            "teacher.placement",
            "standalone",
            f"the DAG ({cfg.dag}) runs no teacher node, so no teacher replicas would start: use "
            "algorithm=gkd|opsd, or algorithm.distill_reward.coef > 0, or leave teacher.placement unset",
        )
    if Role.sampler in roles and cfg.sample.sampler_type.value == "distill" and cfg.teacher.model is None:
        raise ConfigError(
            "teacher.model", None, "sample.sampler_type=distill samples from the teacher: set its model path"
        )
    if Role.rm in roles and cfg.reward.model.path is None:  # reward models as roles
        raise ConfigError(
            "reward.model.path", None, "reward.model.enable=true needs the reward model's directory"
        )
    if not roles & {Role.rm, Role.orm, Role.prm}:  # orm / prm read its micro-batch size
        _check_reward_model_unused(cfg)
    builtin = set(Role) - {Role.reward}
    for name in sorted(roles - builtin):
        if name not in cfg.roles:
            raise ConfigError(
                f"roles.{name}",
                None,
                f"the DAG runs nodes on role {name!r}, which has no built-in backend;"
                f" name the one its plugin registered: +roles.{name}=<backend name>",
            )


def validate_with_plan(cfg: DagrlConfig, plan: Plan) -> None:
    """Rules that need the DP sizes of the placement plan."""
    a, n = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n
    rows = cfg.data.train_batch_size * n
    if Role.teacher in plan.roles:
        layout = plan.roles[Role.teacher]
        check_teacher_group(cfg, list(plan.groups[layout.group].roles), layout.workers)
    for role in (Role.train, Role.rollout, Role.ref, Role.teacher):
        if role not in plan.roles:
            continue
        dp = plan.roles[role].dp
        if rows % dp:
            raise ConfigError(
                "data.train_batch_size",
                cfg.data.train_batch_size,
                f"train_batch_size × rollout.n = {rows} responses must split evenly over the {dp} DP ranks"
                f" of role {role!r}; pick a batch size so that this divides",
            )
    if Role.train not in plan.roles:
        return  # a DAG without an actor update (a plugin's pipeline)
    dp = plan.roles[Role.train].dp
    if (a.ppo_mini_batch_size * n) % dp:
        raise ConfigError(
            f"{A}.ppo_mini_batch_size",
            a.ppo_mini_batch_size,
            f"ppo_mini_batch_size × rollout.n = {a.ppo_mini_batch_size * n} must divide evenly over DP = {dp}",
        )
    per_rank = a.ppo_mini_batch_size * n // dp
    fixed_micro = not a.use_dynamic_bsz  # a token budget cuts micro-batches of any row count
    if (
        fixed_micro
        and per_rank % a.ppo_micro_batch_size_per_gpu
        and a.ppo_micro_batch_size_per_gpu < per_rank
    ):
        raise ConfigError(
            f"{A}.ppo_micro_batch_size_per_gpu",
            a.ppo_micro_batch_size_per_gpu,
            f"each DP rank gets {per_rank} responses per mini-batch; use a micro-batch size that divides it",
        )
    seen = set()
    for spec in plan.specs.values():  # each backend's rules on the DP sizes, once per backend
        entry = BACKENDS.find(spec.kind, spec.backend)
        if entry is not None and entry.plan_rules is not None and entry.plan_rules not in seen:
            seen.add(entry.plan_rules)
            entry.plan_rules(cfg, plan)
    if Role.rollout in plan.roles:
        check_overlap_placement(cfg, plan.roles[Role.rollout].group == plan.roles[Role.train].group)


def _check_data(cfg: DagrlConfig) -> None:
    import pyarrow.parquet as pq

    from dagrl.data.schema import check_prompt_column

    d = cfg.data
    for key in ("train_files", "val_files"):
        for path in data_files(getattr(d, key)):
            if not os.path.isfile(os.path.expanduser(path)):
                raise ConfigError(
                    f"data.{key}",
                    path,
                    "no such file; give parquet files written by examples/data_preprocess/*.py"
                    " (leave unset for the built-in task)",
                )
            try:  # the footer only: a dry run names a wrong data.prompt_key too
                columns = pq.read_schema(os.path.expanduser(path)).names
            except (OSError, ValueError):
                continue  # not parquet: reading the rows says so, naming the file
            check_prompt_column(columns, path, f"data.{key}", d.prompt_key)
    if (d.train_files is None) != (d.val_files is None) and d.val_files is not None:
        raise ConfigError(
            "data.train_files", None, "data.val_files is set but data.train_files is not; set both"
        )


def _check_actor(cfg: DagrlConfig) -> None:
    a = cfg.actor_rollout_ref.actor
    if cfg.data.train_batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"{A}.ppo_mini_batch_size",
            a.ppo_mini_batch_size,
            f"must divide data.train_batch_size={cfg.data.train_batch_size} (both count prompts)",
        )


def _check_rollout(cfg: DagrlConfig) -> None:
    check_off_policy_settings(cfg)
    check_engine_keys(cfg)
    _backend_rules(cfg, role_spec(cfg, Role.rollout))  # the engine's own rules (vllm's kwargs, context)
    check_multi_turn(cfg)


def _check_trainer(cfg: DagrlConfig) -> None:
    t = cfg.trainer
    mode = parse_resume_mode(t.resume_mode)
    if not isinstance(mode, ResumeMode) and not os.path.isdir(mode):
        raise ConfigError(
            "trainer.resume_mode",
            t.resume_mode,
            "use auto, disable, or the path of an existing global_step_N checkpoint directory",
        )
    d = cfg.data
    if t.val_only and d.train_files is not None and d.val_files is None:
        raise ConfigError(
            "trainer.val_only",
            True,
            "validation runs on data.val_files, which is not set: give data.val_files=<parquet>"
            " (or leave data.train_files unset for the built-in task's test rows)",
        )


def _check_teacher(cfg: DagrlConfig) -> None:
    t = cfg.teacher
    if t.model is None:
        return
    if t.placement == TeacherPlacement.standalone:
        # teacher.gpus=0: an even share of the declared cluster (the plan checks TP divides it)
        if t.gpus and t.gpus % t.tensor_model_parallel_size:
            raise ConfigError(
                "teacher.tensor_model_parallel_size",
                t.tensor_model_parallel_size,
                f"must divide teacher.gpus={t.gpus}",
            )
    else:
        if t.gpus:
            raise ConfigError(
                "teacher.gpus",
                t.gpus,
                "a colocated teacher runs on the train devices; leave teacher.gpus at 0",
            )
        if t.engine_kwargs or t.tensor_model_parallel_size != 1:
            raise ConfigError(
                "teacher.engine_kwargs",
                dict(t.engine_kwargs) or t.tensor_model_parallel_size,
                "engine kwargs and tensor_model_parallel_size are for teacher.placement=standalone (vLLM)",
            )
    check_teacher_placement(cfg)
    _backend_rules(
        cfg, role_spec(cfg, Role.teacher)
    )  # a standalone teacher's engine, a megatron teacher's layout


def resolve_device(cfg: DagrlConfig) -> str:
    """'cpu' or 'cuda'. auto = cuda when this machine sees a GPU; else cpu, except that a dry run
    plans GPUs for a declared cluster of more than one device (the plan is for that cluster).
    Never fails a dry run."""
    import torch

    if cfg.trainer.device == Device.auto:
        if torch.cuda.is_available():
            return "cuda"
        declared = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node > 1
        return "cuda" if cfg.trainer.dry_run and declared else "cpu"
    if cfg.trainer.device == Device.cuda and not torch.cuda.is_available() and not cfg.trainer.dry_run:
        if cfg.trainer.ray_address is None:
            raise ConfigError(
                "trainer.device", "cuda", "no GPU is visible here; use trainer.device=cpu or run on GPUs"
            )
    return cfg.trainer.device.value


def data_files(value) -> list[str]:
    """data.train_files may be one path, a comma-free list, or None."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _check_reward_model_unused(cfg: DagrlConfig) -> None:
    """reward.model.* set while no reward model runs (reward.model.enable=false) would do nothing."""
    from dataclasses import fields

    from dagrl.config.sample_schema import RewardModelConfig

    m, default = cfg.reward.model, RewardModelConfig()
    for f in fields(m):
        value = getattr(m, f.name)
        if f.name != "enable" and value != getattr(default, f.name):
            raise ConfigError(
                f"reward.model.{f.name}",
                getattr(value, "value", value),
                "no reward model runs (reward.model.enable=false): set reward.model.enable=true, or remove it",
            )
