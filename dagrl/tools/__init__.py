"""Tools and environments for multi-turn rollouts (dagrl/rollout); see dagrl/tools/base.py."""

# the built-in tools, environments and parsers register themselves on import (after base)
from dagrl.tools import calculator, environment, parsers, sandbox  # noqa: E402, F401
from dagrl.tools.base import (  # noqa: F401
    Environment,
    StepResult,
    Tool,
    ToolCall,
    register_environment,
    register_parser,
    register_tool,
)
