"""Rules of actor_rollout_ref.rollout.multi_turn, checked before Ray starts (plugins are loaded
by then, so registered tools, environments and parsers are known).

The length budget: data.max_response_length bounds a whole episode after its prompt — every
policy turn, observation and template token — and each turn may sample what the earlier ones
left (an episode whose next observation would not fit ends there, stop reason `length`). So the
rule is that one observation at its longest plus one token per policy turn fits:
    max_assistant_turns + max_tool_response_length + template tokens ≤ max_response_length
and, as for every rollout, prompt + max_response_length ≤ the vLLM engine's max_model_len
(validate_rollout.py).
"""

from __future__ import annotations

from dagrl.config.schema import DagrlConfig, TurnRewardMode
from dagrl.errors import ConfigError
from dagrl.registry import ESTIMATORS

MT = "actor_rollout_ref.rollout.multi_turn"
TEMPLATE_ALLOWANCE = 8  # delimiter tokens of an observation turn (Qwen: 5), checked at start
# single-turn DAG -> its multi-turn form (rollout outputs response_attention_mask, turn_ids, ...)
MULTI_TURN_DAGS = {
    "grpo": "grpo_multi_turn",
    "gkd": "gkd_multi_turn",
    "opsd": "opsd_multi_turn",
    "ppo": "ppo_multi_turn",
}


def multi_turn_dag(cfg: DagrlConfig) -> str:
    """The DAG this config runs: with multi_turn.enable=true a built-in algorithm's DAG in its
    multi-turn form (verl turns multi-turn on with that one key; the episodes' masks, turn ids and
    environment rewards need the nodes that carry them), else `dag` as given."""
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        return MULTI_TURN_DAGS.get(cfg.dag, cfg.dag)
    return cfg.dag


def check_multi_turn(cfg: DagrlConfig) -> None:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return
    from dagrl.rollout.multi_turn import load_tools
    from dagrl.tools.base import ENVIRONMENTS, PARSERS, lookup

    if cfg.actor_rollout_ref.rollout.ignore_eos and mt.max_tokens_per_turn is None:
        raise ConfigError(  # a turn hands over at EOS or at its own cap; with neither it runs out
            "actor_rollout_ref.rollout.ignore_eos",
            True,
            "a multi-turn turn hands over to the tools at EOS; sampling past it with no per-turn cap,"
            f" every episode ends at its first turn: set it to false, or cap the turns with"
            f" {MT}.max_tokens_per_turn",
        )
    lookup(ENVIRONMENTS, mt.environment, f"{MT}.environment")
    lookup(PARSERS, mt.format, f"{MT}.format")
    tools = load_tools(mt.tool_config_path)
    if mt.environment == "tools" and not tools:
        raise ConfigError(
            f"{MT}.tool_config_path",
            mt.tool_config_path,
            "the `tools` environment needs a tool config file listing tools (e.g. conf/tools/python.yaml)",
        )
    need = mt.max_assistant_turns + mt.max_tool_response_length + TEMPLATE_ALLOWANCE
    if need > cfg.data.max_response_length:
        raise ConfigError(
            "data.max_response_length",
            cfg.data.max_response_length,
            f"bounds a whole multi-turn episode after its prompt; one observation of {MT}."
            f"max_tool_response_length={mt.max_tool_response_length} tokens plus one token per policy "
            f"turn ({mt.max_assistant_turns}) and {TEMPLATE_ALLOWANCE} template tokens need {need}: "
            "raise it or lower those",
        )
    # an engine's own limits under multi-turn are its rules (vLLM's one engine per GPU: vllm/rules.py)
    check_turn_rewards(cfg)


def check_turn_rewards_dag(cfg: DagrlConfig, node_kinds: set[str]) -> None:
    """turn_reward_mode=turn shapes advantages: the DAG this config runs (its node kinds, from
    `prepare`) needs an advantage node; the distillation DAGs log their reward only."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.turn_reward_mode == TurnRewardMode.turn and "advantage" not in node_kinds:
        raise ConfigError(
            f"{MT}.turn_reward_mode",
            mt.turn_reward_mode.value,
            f"dag={cfg.dag} computes no advantages (its reward is logged only): use trajectory",
        )


def check_turn_rewards(cfg: DagrlConfig) -> None:
    """turn_reward_mode=turn is GRPO's group normalisation per turn, or, for an estimator that reads
    rewards token by token (reinforce_plus_plus, gae), the turns' rewards inside its returns (the
    DAG's part of the rule: check_turn_rewards_dag)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.turn_reward_mode != TurnRewardMode.turn:
        return
    name = cfg.algorithm.adv_estimator
    if name != "grpo" and not ESTIMATORS.get(name).token_level:
        token_level = ", ".join(n for n in ESTIMATORS.names() if ESTIMATORS.get(n).token_level)
        raise ConfigError(
            f"{MT}.turn_reward_mode",
            mt.turn_reward_mode.value,
            f"per-turn credit is group-normalised (grpo) or part of token returns ({token_level});"
            f" algorithm.adv_estimator={name} has neither form: use trajectory, or one of those estimators",
        )
