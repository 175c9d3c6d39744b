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

from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError

MT = "actor_rollout_ref.rollout.multi_turn"
TEMPLATE_ALLOWANCE = 8  # delimiter tokens of an observation turn (Qwen: 5), checked at start


def check_multi_turn(cfg: DagrlConfig) -> None:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return
    from dagrl.rollout.multi_turn import load_tools
    from dagrl.tools.base import ENVIRONMENTS, PARSERS, lookup

    if cfg.dag == "grpo":
        raise ConfigError(
            "dag", cfg.dag, "multi-turn rows need the DAG that carries their masks: dag=grpo_multi_turn"
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
    if cfg.algorithm.distill_reward.coef:
        raise ConfigError(
            "algorithm.distill_reward.coef",
            cfg.algorithm.distill_reward.coef,
            f"the teacher does not yet read multi-turn rows (observations inside the response); "
            f"set 0 with {MT}.enable=true",
        )
    if cfg.algorithm.name in ("gkd", "opsd"):
        raise ConfigError(
            f"{MT}.enable",
            True,
            f"algorithm={cfg.algorithm.name} scores responses with a teacher that does not yet read "
            "multi-turn rows (observations inside the response); use GRPO-family algorithms",
        )
