"""Rules of PPO's value model (critic.*, trainer.critic_warmup), checked before Ray starts.

The critic runs exactly when the estimator learns from values (`algorithm.adv_estimator=gae`,
config/critic_role.py: critic_runs), as in verl; a critic key set while none runs, or a warm-up without
one, is refused rather than ignored. Whether the DAG has the critic's nodes is the advantage
node's rule (nodes/advantage.py: check_config), since only the loaded DAG knows.
"""

from __future__ import annotations

from dataclasses import fields

from dagrl.config.critic_role import critic_runs, critic_update
from dagrl.config.roles import Role
from dagrl.config.schema import CriticConfig, DagrlConfig
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS

C = "critic"
_PPO = "algorithm=ppo (algorithm.adv_estimator=gae)"


def check_critic(cfg: DagrlConfig) -> None:
    if not critic_runs(cfg):
        _check_no_critic(cfg)
        return
    c = cfg.critic
    critics = BACKENDS.names(Role.critic)
    if c.strategy not in critics and c.strategy in BACKENDS.names(Role.train):
        raise ConfigError(
            f"{C}.strategy",
            c.strategy,
            f"a {c.strategy} critic is planned, not built yet (its value head replaces the backend's"
            f" output layer): use {C}.strategy={' or '.join(critics)}, which trains beside any actor backend",
        )
    for name, (owner, section) in BACKENDS.sections(c).items():
        if owner == c.strategy:
            continue
        for key, value, default in _changed(section, type(section)(), f"{C}.{name}"):  # ignored
            raise ConfigError(
                key, value, f"only read with {C}.strategy={owner}; set it or leave the key at {default!r}"
            )
    BACKENDS.lookup(Role.critic, c.strategy, f"{C}.strategy")
    update = critic_update(cfg)
    if cfg.data.train_batch_size % update.ppo_mini_batch_size:
        raise ConfigError(
            f"{C}.ppo_mini_batch_size",
            update.ppo_mini_batch_size,
            f"must divide data.train_batch_size ({cfg.data.train_batch_size}) into whole mini-batches",
        )


def check_critic_plan(cfg: DagrlConfig, plan) -> None:
    """The critic's mini-batches split evenly over its DP ranks, and its micro-batches divide a
    rank's share (as the actor's); its DP is its group's, which need not be the actor's. Registered
    as the torch critic's plan rule (backends/builtin.py)."""
    if Role.critic not in plan.roles:
        return
    update, n, dp = critic_update(cfg), cfg.actor_rollout_ref.rollout.n, plan.roles[Role.critic].dp
    if (update.ppo_mini_batch_size * n) % dp:
        raise ConfigError(
            f"{C}.ppo_mini_batch_size",
            update.ppo_mini_batch_size,
            f"× rollout.n = {update.ppo_mini_batch_size * n} responses must split evenly over the critic's"
            f" DP = {dp}",
        )
    per_rank, micro = update.ppo_mini_batch_size * n // dp, update.ppo_micro_batch_size_per_gpu
    if not update.use_dynamic_bsz and micro < per_rank and per_rank % micro:
        raise ConfigError(
            f"{C}.ppo_micro_batch_size_per_gpu",
            micro,
            f"each critic DP rank gets {per_rank} responses per mini-batch; use a micro-batch size that divides it",
        )


def _check_no_critic(cfg: DagrlConfig) -> None:
    """No critic runs: its warm-up and every critic.* key away from its default are mistakes."""
    why = f"no critic runs (algorithm.adv_estimator={cfg.algorithm.adv_estimator}); it runs with {_PPO}"
    if cfg.trainer.critic_warmup:
        raise ConfigError("trainer.critic_warmup", cfg.trainer.critic_warmup, f"{why}; remove the key")
    for key, value, default in _changed(cfg.critic, CriticConfig(), C):
        raise ConfigError(key, value, f"{why}; remove the key (default {default!r})")


def _changed(section, default, prefix: str):
    """(dotted key, value, default) of every leaf of a dataclass section that differs from default."""
    for f in fields(section):
        value, base, key = getattr(section, f.name), getattr(default, f.name), f"{prefix}.{f.name}"
        if hasattr(value, "__dataclass_fields__"):
            yield from _changed(value, base, key)
        elif value != base:
            yield key, getattr(value, "value", value), getattr(base, "value", base)
