"""From a typed config to a running Trainer, in two halves:

`prepare` checks everything that can be checked without Ray (config rules, placement plan, DAG,
data files and rows) so bad input fails before any worker or GPU is taken; `launch` then
starts Ray, reserves the plan's bundles, builds the pools and the scheduler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dagrl.backends.hf_model import check_model_dir, load_tokenizer, resolve_model_path
from dagrl.backends.registry import check_backends
from dagrl.config.enums import SelfTeacher
from dagrl.config.placement import Plan, make_plan
from dagrl.config.role_specs import build_role_specs
from dagrl.config.roles import RoleSpec
from dagrl.config.schema import DagrlConfig
from dagrl.config.validate import (
    check_role_devices,
    check_role_rules,
    data_files,
    resolve_defaults,
    resolve_device,
    validate,
    validate_roles,
    validate_with_plan,
)
from dagrl.config.validate_dapo import check_dapo_dag
from dagrl.config.validate_multi_turn import check_turn_rewards_dag
from dagrl.config.validate_rollout import check_logprob_readers
from dagrl.core.dag import (
    Dag,
    build_dag,
    check_node_rules,
    load_dag_file,
    load_dag_specs,
    prune_disabled,
    prune_unconsumed,
)
from dagrl.core.plugins import absolute_plugin_paths, load_plugins
from dagrl.data.parquet import PromptDataset, PromptLoader
from dagrl.errors import ConfigError
from dagrl.rewards import RewardComposer, RewardTerm
from dagrl.trainer.capacity import check_dataset_size, device_memory_gib, plan_device_memory
from dagrl.trainer.logger import check_loggers
from dagrl.trainer.memory_plan import MemoryPlan, dag_phases, record_resident_memory
from dagrl.trainer.preflight import check_run_outside


@dataclass
class Prepared:
    cfg: DagrlConfig
    device: str
    plan: Plan
    dag: Dag
    model_path: str
    val_dags: tuple[Dag, Dag] | None = None  # (before any update: no weight sync, later: with it)
    warnings: tuple[str, ...] = ()  # printed with the plan (a dry run's memory warning)
    memory: MemoryPlan | None = None  # per device and phase (GPU plans with a known card size)


def prepare(cfg: DagrlConfig) -> Prepared:
    absolute_paths(cfg)
    load_plugins(list(cfg.external_plugins))
    resolve_defaults(cfg)
    check_models(cfg)
    validate(cfg)
    check_rewards_for_data(cfg)
    device = resolve_device(cfg)
    dag_file = load_dag_file(cfg.dag)
    source, specs = dag_file.source, prune_unconsumed(prune_disabled(dag_file.specs, cfg), dag_file.sinks)
    check_node_rules(specs, cfg)  # each node kind's own rules, for the nodes this config runs
    check_logprob_readers(cfg, specs)  # a node that requires the engine's log-probs has them
    check_turn_rewards_dag(cfg, {s.kind for s in specs})
    check_dapo_dag(cfg, {s.kind for s in specs})
    role_names = {s.role for s in specs if s.role} | validation_roles(cfg)
    validate_roles(cfg, role_names)
    roles = build_role_specs(cfg, role_names)
    check_backends(roles.values(), None if cfg.trainer.dry_run else device)
    check_role_rules(cfg, roles.values())  # each role's backend's own config rules
    check_role_devices(cfg, roles.values(), device)  # each backend's needs of the device (vLLM: GPUs)
    plan = make_plan(cfg, roles, device)
    validate_with_plan(cfg, plan)
    dag = build_dag(cfg.dag, source, specs, set(plan.roles))
    model_path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    check_dataset_size(cfg)
    check_loggers([getattr(x, "value", x) for x in cfg.trainer.logger])
    phases = dag_phases(n.kind for n in dag.nodes)
    memory, warning = plan_device_memory(cfg, plan, model_path, phases)  # a real run raises instead
    # the per-role figures after the plan chose what auto leaves open (offload, optimizer place)
    record_resident_memory(cfg, plan, model_path, device_memory_gib(cfg)[0])
    check_run_outside(cfg, plan, _count_params(cfg, model_path)[0] if cfg.trainer.save_freq > 0 else None)
    warnings = (warning,) if warning else ()
    val_dags = validation_dags(set(plan.roles), validation_dag_name(cfg))
    if cfg.trainer.val_only and val_dags is None:
        raise ConfigError(
            "trainer.val_only",
            True,
            f"the DAG ({cfg.dag}) has no rollout and train roles to validate with; drop trainer.val_only",
        )
    return Prepared(cfg, device, plan, dag, model_path, val_dags, warnings, memory)


def absolute_paths(cfg: DagrlConfig) -> None:
    """Files the workers read (plugins, the tool config) named as the driver finds them: a worker's
    working directory is not the driver's."""
    cfg.external_plugins = absolute_plugin_paths(list(cfg.external_plugins))
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.tool_config_path is not None:
        from dagrl.rollout.multi_turn import tool_config_file

        mt.tool_config_path = tool_config_file(mt.tool_config_path)


def check_models(cfg: DagrlConfig) -> None:
    """The model directories (actor, teacher, critic) have a readable config.json and whole weights; a
    dry run needs the config only (a plan for a large model, made before its weights are fetched)."""
    weights = not cfg.trainer.dry_run
    if cfg.actor_rollout_ref.model.path is not None:
        check_model_dir(cfg.actor_rollout_ref.model.path, "actor_rollout_ref.model.path", weights)
    if cfg.teacher.model is not None and cfg.teacher.model not in {t.value for t in SelfTeacher}:
        check_model_dir(cfg.teacher.model, "teacher.model", weights)
    if cfg.critic.model.path is not None:  # refused without a critic (config/validate_critic.py)
        check_model_dir(cfg.critic.model.path, "critic.model.path", weights)


def check_rewards_for_data(cfg: DagrlConfig) -> None:
    """Every data_source in the parquet files has a reward, before any step samples it: only the
    data_source column is read; the first row of each source without one is named. With
    reward.functions set every row gets those (their names are checked by the composer)."""
    import pyarrow.parquet as pq

    from dagrl.errors import DataError
    from dagrl.rewards import default_reward_name

    rewarder_for(cfg)  # unknown reward names in reward.functions
    if cfg.reward.functions:
        return
    for key in ("data.train_files", "data.val_files"):
        for path in data_files(getattr(cfg.data, key.split(".")[1])):
            path = os.path.expanduser(path)
            try:
                sources = pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist()
            except Exception:  # unreadable or no such column: reading the rows reports it, before Ray
                continue
            seen: set = set()
            for row, source in enumerate(sources):
                if source in seen:
                    continue
                seen.add(source)
                try:
                    default_reward_name(str(source))
                except DataError as exc:
                    raise DataError(f"{key}: {path} row {row}: {exc}") from None


def validation_dag_name(cfg: DagrlConfig) -> str:
    """A training DAG `<name>` validates with conf/dags/<name>_validate.yaml when there is one
    (SFT: its validation loss next to greedy sampling); multi-turn rollouts validate with
    validate_multi_turn.yaml; else conf/dags/validate.yaml."""
    from dagrl.core.dag import dag_path

    if cfg.actor_rollout_ref.rollout.multi_turn.enable:  # episodes, not single responses
        return "validate_multi_turn"
    own = f"{cfg.dag}_validate"
    return own if not cfg.dag.endswith((".yaml", ".yml")) and os.path.isfile(dag_path(own)) else "validate"


def validation_roles(cfg: DagrlConfig) -> set[str]:
    """Roles only the DAG's own validation runs on (SFT's rollout role, for greedy sampling): they
    get pools too. The shared validation DAG runs on the training DAG's roles."""
    name = validation_dag_name(cfg)
    t = cfg.trainer
    if name in ("validate", "validate_multi_turn") or (
        t.test_freq <= 0 and not t.val_before_train and not t.val_only
    ):
        return set()
    return {s.role for s in load_dag_specs(name)[1] if s.role}


def validation_dags(roles: set[str], name: str = "validate") -> tuple[Dag, Dag] | None:
    """The validation DAG (conf/dags/<name>.yaml) without and with its weight sync; None when
    the training DAG has no rollout role to sample with."""
    from dagrl.config.roles import Role

    if not {Role.rollout, Role.train} <= roles:
        return None
    dag_file = load_dag_file(name)
    source, specs = dag_file.source, prune_unconsumed(dag_file.specs, dag_file.sinks)
    first = [s for s in specs if s.kind != "weight_sync"]
    for s in first:
        s.after = [a for a in s.after if a in {f.name for f in first}]
    return build_dag(name, source, first, roles), build_dag(name, source, specs, roles)


def _count_params(cfg: DagrlConfig, model_path: str) -> tuple[int, int]:
    """(all parameters, those in routed experts), counted on the meta device (nothing is loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(
        model_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code
    )
    with torch.device("meta"):
        named = list(AutoModelForCausalLM.from_config(hf_cfg).named_parameters())
    experts = sum(p.numel() for name, p in named if ".experts." in name)
    return sum(p.numel() for _, p in named), experts


def load_data(cfg: DagrlConfig, model_path: str):
    """Tokenizer, training loader and validation dataset (None when there is none)."""
    tokenizer = load_tokenizer(model_path, cfg.actor_rollout_ref.model.trust_remote_code)
    d = cfg.data
    common = dict(
        max_prompt_length=d.max_prompt_length,
        prompt_key=d.prompt_key,
        filter_overlong=d.filter_overlong_prompts,
        response_key=d.response_key,
    )
    if d.train_files is None:
        from dagrl.data.builtin_tasks import builtin_rows

        privileged = cfg.algorithm.name == "opsd"  # under gkd, rows with one would be OPSD
        rows = {
            s: builtin_rows(d.builtin_task, s, n, d.seed, privileged)
            for s, n in (("train", d.builtin_train_rows), ("test", d.builtin_val_rows))
        }
        train = PromptDataset.from_rows(rows["train"], tokenizer, source="built-in task (train)", **common)
        val = PromptDataset.from_rows(
            rows["test"], tokenizer, source="built-in task (test)", key="data.val_files", **common
        )
    else:
        train = PromptDataset(data_files(d.train_files), tokenizer, **common)
        val = (
            PromptDataset(data_files(d.val_files), tokenizer, key="data.val_files", **common)
            if d.val_files is not None
            else None
        )
    loader = PromptLoader(train, d.train_batch_size, shuffle=d.shuffle, seed=d.seed)
    return tokenizer, loader, val


def rewarder_for(cfg: DagrlConfig) -> RewardComposer:
    return RewardComposer([RewardTerm(t.name, t.weight, dict(t.kwargs)) for t in cfg.reward.functions])


def init_ray(cfg: DagrlConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cfg.trainer.ray_address:
        from dagrl.trainer.preflight import resolve_ray_address

        # auto: the cluster the preflight found, not Ray's fallback to any Ray running on this machine
        ray.init(address=resolve_ray_address(cfg.trainer.ray_address), log_to_driver=True)
    else:
        # "local": trainer.ray_address=null means a Ray of this run's own, even when another is running here
        ray.init(address="local", include_dashboard=False, log_to_driver=True, configure_logging=False)


def worker_parts(cfg: DagrlConfig, specs: dict[str, RoleSpec]):
    """What a worker hosting `specs` is started with, outside a pool (a bench, a GPU test): the
    plugins, each role's spec and a trained role's objective (core/worker.py: WorkerParts)."""
    from dagrl.core.worker import RoleParts, WorkerParts
    from dagrl.objectives import role_objectives

    objectives = role_objectives(cfg, specs.values())
    parts = {role: RoleParts(spec, objectives.get(role)) for role, spec in specs.items()}
    return WorkerParts.pack(list(cfg.external_plugins), parts)


def launch(prepared: Prepared, tokenizer, rewarder):
    """Start (or join) Ray, reserve bundles, build pools and role handles. Returns (runtime, pools,
    bundles): the role handles and the driver's state, the worker pools to shut down at the end,
    and the placement-group bundles to release after them."""
    from dagrl.backends import build_backend
    from dagrl.backends.handles import make_handle
    from dagrl.backends.registry import startup_order
    from dagrl.core.pools import WorkerPool, allocate
    from dagrl.core.runtime import Runtime
    from dagrl.objectives import role_objectives

    init_ray(prepared.cfg)
    # the workers get the specs as the plan resolved them, and the objectives built here
    objectives = role_objectives(prepared.cfg, prepared.plan.specs.values())
    bundles = allocate(prepared.plan)
    pools: list[WorkerPool] = []
    try:
        for group in prepared.plan.groups:
            startup = startup_order(prepared.plan.specs[r] for r in group.roles)  # engines first
            pools.append(
                WorkerPool(
                    group,
                    bundles,
                    prepared.plan,
                    prepared.cfg,
                    build=build_backend,
                    startup=startup,
                    objectives=objectives,
                )
            )
    except BaseException:
        # a pool that failed to start (a backend raised, an actor died) must not keep the devices
        for pool in pools:
            pool.shutdown()
        bundles.release()
        raise
    roles = {}
    for pool in pools:
        for role in pool.roles:
            roles[role] = make_handle(prepared.plan.specs[role], pool)
    runtime = Runtime(cfg=prepared.cfg, roles=roles, tokenizer=tokenizer, rewarder=rewarder)
    return runtime, pools, bundles
