"""The built-in environment `tools`: parse the policy's tool calls, run them concurrently, answer
with their results. A turn without a tool call ends the episode (it is the answer).

Failures never end the run: a call that cannot be parsed, names an unknown tool, raises, or
outlives multi_turn.tool_timeout_s answers with an error text the policy sees, and is counted in
the step's info (tools/errors, tools/timeouts). Python cannot stop a thread, so a callable that
hangs keeps its worker thread until it returns; tools that may hang should bound themselves (the
python tool kills its subprocess at its own time limit).
"""

from __future__ import annotations

import time
from concurrent.futures import Executor, wait
from dataclasses import dataclass

from dagrl.tools.base import StepResult, Tool, ToolCall, register_environment


@dataclass
class ToolSettings:
    parser: object  # parse(text) -> list[ToolCall]
    max_parallel_calls: int
    tool_timeout_s: float
    episode_tool_timeout_s: float


class ToolEnvironment:
    """One episode's tool loop. `pool` runs the calls (shared by all episodes of a rollout)."""

    def __init__(self, settings: ToolSettings, tools: dict[str, Tool], pool: Executor):
        self.settings, self.tools, self.pool = settings, tools, pool
        self.tool_seconds = 0.0

    def reset(self, row: dict) -> str | None:
        self.tool_seconds = 0.0
        return None

    def step(self, action: str) -> StepResult:
        calls = self.settings.parser(action)
        if not calls:
            return StepResult(None, done=True)
        s = self.settings
        if self.tool_seconds >= s.episode_tool_timeout_s:
            return StepResult(None, done=True, info={"tools/episode_timeouts": 1.0})
        info = {"tools/calls": float(len(calls)), "tools/errors": 0.0, "tools/timeouts": 0.0}
        results: list[str | None] = [None] * len(calls)
        futures = {}
        for i, call in enumerate(calls):
            refused = self._refusal(call, i)
            if refused is not None:
                results[i] = refused
                info["tools/errors"] += 1
            else:
                futures[self.pool.submit(_call, self.tools[call.name], call)] = i
        start = time.perf_counter()
        budget = min(s.tool_timeout_s, s.episode_tool_timeout_s - self.tool_seconds)
        done, _ = wait(futures, timeout=budget)
        self.tool_seconds += time.perf_counter() - start
        for future, i in futures.items():
            if future not in done:
                future.cancel()
                results[i] = f"Error: tool {calls[i].name!r} timed out after {s.tool_timeout_s:g} s"
                info["tools/timeouts"] += 1
                continue
            ok, text = future.result()
            results[i] = text
            info["tools/errors"] += 0.0 if ok else 1.0
        return StepResult("\n".join(r for r in results if r is not None), info=info)

    def _refusal(self, call: ToolCall, index: int) -> str | None:
        if call.error is not None:
            return f"Error: {call.error}"
        if call.name not in self.tools:
            return f"Error: unknown tool {call.name!r}; tools: {sorted(self.tools)}"
        if index >= self.settings.max_parallel_calls:
            return f"Error: at most {self.settings.max_parallel_calls} tool calls per turn"
        return None


def _call(tool: Tool, call: ToolCall) -> tuple[bool, str]:
    try:
        return True, str(tool.fn(**call.arguments))
    except Exception as e:  # a tool's failure is an observation, never the run's end
        return False, f"Error: {type(e).__name__}: {e}"


@register_environment("tools")
def tool_environment(settings: ToolSettings, tools: dict[str, Tool], pool: Executor) -> ToolEnvironment:
    return ToolEnvironment(settings, tools, pool)
