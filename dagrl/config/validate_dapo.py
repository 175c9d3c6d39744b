"""DAPO's rules: dynamic sampling (algorithm.filter_groups) and the overlong penalty
(reward.overlong_buffer), checked before Ray starts; the DAG's part of them in `prepare`."""

from __future__ import annotations

from dagrl.config.enums import FilterMetric
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError

FG = "algorithm.filter_groups"


def check_dapo(cfg: DagrlConfig) -> None:
    """Rules between keys: a filter of groups needs groups, one step's batch at a time, and a
    metric that exists before the filter; the penalty's buffer fits in the response limit."""
    _check_overlong_buffer(cfg)
    fg = cfg.algorithm.filter_groups
    if not fg.enable:
        return
    n = cfg.actor_rollout_ref.rollout.n
    if n < 2:
        raise ConfigError(
            "actor_rollout_ref.rollout.n",
            n,
            f"{FG}.enable drops groups whose responses all got the same reward: a group of one always"
            " would be; use rollout.n >= 2 (DAPO: 16), or filter_groups.enable=false",
        )
    if cfg.actor_rollout_ref.rollout.overlap_steps:
        raise ConfigError(
            f"{FG}.enable",
            True,
            "dynamic sampling draws more prompts until the batch is full, which a rollout sampled one"
            " step ahead cannot wait for: use actor_rollout_ref.rollout.overlap_steps=0",
        )
    if fg.metric == FilterMetric.seq_final_reward and cfg.algorithm.use_kl_in_reward:
        raise ConfigError(
            f"{FG}.metric",
            fg.metric.value,
            "the KL in the reward is computed after the filter (on the kept groups only): use"
            " seq_reward (the same without the KL)",
        )


def _check_overlong_buffer(cfg: DagrlConfig) -> None:
    ob, limit = cfg.reward.overlong_buffer, cfg.data.max_response_length
    if ob.enable and ob.len >= limit:
        raise ConfigError(
            "reward.overlong_buffer.len",
            ob.len,
            f"the penalty grows over the last len tokens before data.max_response_length={limit}:"
            f" use a len below it (DAPO: a fifth of the limit, e.g. {max(1, limit // 5)})",
        )


def check_dapo_dag(cfg: DagrlConfig, node_kinds: set[str]) -> None:
    """Dynamic sampling filters on the reward and trains through advantages: the DAG this config
    runs needs both (the distillation DAGs log their reward only). Overlong shaping acts in the
    advantage node, so it needs that node too."""
    if cfg.algorithm.filter_groups.enable and not {"reward", "advantage"} <= node_kinds:
        raise ConfigError(
            f"{FG}.enable",
            True,
            f"dag={cfg.dag} has no reward and advantage nodes to filter groups on: use algorithm=dapo"
            " (or another GRPO-family preset), or filter_groups.enable=false",
        )
    if cfg.reward.overlong_buffer.enable and "advantage" not in node_kinds:
        raise ConfigError(
            "reward.overlong_buffer.enable",
            True,
            f"dag={cfg.dag} computes no advantages, so a reward penalty would change nothing: set it false",
        )
