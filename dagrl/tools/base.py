"""Tools and environments: the contracts a multi-turn rollout drives, and their registries.

An **environment** is what the policy acts in, one instance per episode:
    reset(row) -> observation | None      before the first turn (row: the data row's fields)
    step(action) -> StepResult            after each policy turn (action: the turn's decoded text)
StepResult carries the observation (text appended as an observation turn), a reward, whether the
episode is done, and an info dict (counted into metrics when its values are numbers).

A **tool** is a Python callable with a JSON schema (the form TRL and verl tool configs use); the
built-in environment `tools` parses the policy's tool calls with a registered parser and runs them.

Plugins register their own with `register_tool`, `register_environment` and `register_parser`
from a module listed in `external_plugins`, exactly as the built-ins below do.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dagrl.errors import ConfigError

MT = "actor_rollout_ref.rollout.multi_turn"


@dataclass
class ToolCall:
    """One call the policy asked for; `error` is set when the call text could not be parsed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass
class StepResult:
    observation: str | None
    reward: float = 0.0
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, row: dict) -> str | None:
        """Start an episode for a data row; returns an observation or None (the prompt is the
        row's own and already holds the task)."""
        ...

    def step(self, action: str) -> StepResult:
        """React to one policy turn (its decoded text, special tokens dropped)."""
        ...


@dataclass
class Tool:
    """A callable the policy may call by name: `fn(**arguments) -> str` (other results are
    str()-ed). `parameters` is the JSON schema of the arguments, shown to the model by the chat
    template when the data layer renders tools into the prompt."""

    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict:
        """The OpenAI/Qwen function schema of the tool."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


# name -> factory(config dict) -> Tool / Environment factory(settings, tools) / parser(text)
TOOLS: dict[str, Callable[..., Tool]] = {}
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}
PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {}


def register_tool(name: str):
    """Register `factory(**config) -> Tool` under `name` (a tool config's `name`)."""
    return _register(TOOLS, name)


def register_environment(name: str):
    """Register `factory(settings: EpisodeSettings, tools: dict[str, Tool]) -> Environment`."""
    return _register(ENVIRONMENTS, name)


def register_parser(name: str):
    """Register `parse(text) -> list[ToolCall]` under `name` (multi_turn.format)."""
    return _register(PARSERS, name)


def _register(table: dict, name: str):
    def wrap(obj):
        table[name] = obj
        return obj

    return wrap


def lookup(table: dict, name: str, key: str):
    """The entry `name` of a registry, or a ConfigError naming the key and the nearest name."""
    if name in table:
        return table[name]
    near = difflib.get_close_matches(name, list(table), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(
        key, name, f"{hint}known: {sorted(table)}; plugins register theirs from a module in external_plugins"
    )
