"""Tools and environments for multi-turn rollouts (dagrl/rollout); see dagrl/tools/base.py."""

from dagrl.tools.base import (  # noqa: F401
    Environment,
    StepResult,
    Tool,
    ToolCall,
    register_environment,
    register_parser,
    register_tool,
)
