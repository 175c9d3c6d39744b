"""Tool-call parsers: the policy's turn text -> the calls it asks for (multi_turn.format)."""

from __future__ import annotations

import json
import re

from dagrl.tools.base import ToolCall, register_parser

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register_parser("hermes")
def parse_hermes(text: str) -> list[ToolCall]:
    """Qwen/Hermes calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number
    per turn. A call whose body is not such JSON comes back with `error` set (answered with an
    error observation, so the policy learns the format), never raises."""
    calls = []
    for body in _HERMES.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", {}, f"invalid JSON in <tool_call>: {e.msg}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall("", {}, 'a tool call needs {"name": str, "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(obj["name"], {}, "arguments must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls
