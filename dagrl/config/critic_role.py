"""The critic's role spec (PPO's value model, critic.*): when it runs, its update section with the
actor's values where its own are unset, and the spec its backend is built from."""

from __future__ import annotations

from dataclasses import replace

from dagrl.config.roles import ModelSpec, OffloadPolicy, ParallelLayout, Role, RoleSpec, _train_settings
from dagrl.config.schema import CriticConfig, DagrlConfig
from dagrl.registry import BACKENDS, ESTIMATORS


def critic_runs(cfg: DagrlConfig) -> bool:
    """Whether the run has a critic: exactly when the estimator learns from values (GAE, or a
    plugin's estimator registered with critic_targets), as verl's need_critic."""
    name = cfg.algorithm.adv_estimator
    return name in ESTIMATORS and ESTIMATORS.get(name).critic_targets


def critic_update(cfg: DagrlConfig) -> CriticConfig:
    """critic.* with its defaults resolved: the actor's mini-batch size, epochs and learning rate
    where the critic's are unset."""
    c, actor = cfg.critic, cfg.actor_rollout_ref.actor
    optim = c.optim if c.optim.lr is not None else replace(c.optim, lr=actor.optim.lr)
    return replace(
        c,
        optim=optim,
        ppo_mini_batch_size=c.ppo_mini_batch_size or actor.ppo_mini_batch_size,
        ppo_epochs=c.ppo_epochs or actor.ppo_epochs,
    )


def critic_spec(cfg: DagrlConfig) -> RoleSpec:
    """The value model: the critic's train backend on critic.model (the actor's by default), trained
    with critic.* (its update section), its forward passes at critic.forward_micro_batch_size."""
    c, arr = cfg.critic, cfg.actor_rollout_ref
    path = c.model.path if c.model.path is not None else arr.model.path
    mega = BACKENDS.own_section(c, c.strategy)  # its backend's own section in critic.*, if any
    on = arr.actor.offload is not False  # the actor's offload policy: the two take turns alike
    parallel, offload = ParallelLayout(), OffloadPolicy(params=on, grads=on, optimizer=on)
    # the critic's backend reads its own section as its train kind reads the actor's (the hooks
    # that backend registered, whatever actor.strategy is): megatron's layout and three switches
    hooks = BACKENDS.backend(c.strategy).hooks if BACKENDS.find(Role.critic, c.strategy) else None
    if mega is not None and hooks is not None:
        parallel, offload = hooks.layout(mega), hooks.offload(cfg, mega)
    return RoleSpec(
        name=Role.critic.value,
        kind=Role.critic.value,
        backend=c.strategy,
        backend_key="critic.strategy",
        model=ModelSpec(path, c.model.dtype or arr.model.dtype, None, arr.model.trust_remote_code),
        parallel=parallel,
        micro_batch_size=c.ppo_micro_batch_size_per_gpu,
        logprob_micro_batch_size=c.forward_micro_batch_size_per_gpu,
        trains=True,
        offload=offload,
        megatron=mega,
        train=replace(
            _train_settings(cfg, trains=False),
            packing=False,
            logprob_token_budget=None,
            update=critic_update(cfg),
        ),
    )
